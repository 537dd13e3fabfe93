//! What the fenced writers share: one write to the fenced store.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// PUTs `body` to `path` on the fenced store at `addr` with the fencing
/// token `token`; returns the HTTP status (204 accepted, 409 stale).
pub fn put(addr: &str, path: &str, token: &str, body: &str) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nFencing-Token: {token}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP reply: {reply:?}")))
}
