//! A TCP proxy to one store server that can cut every connection through
//! it: how the chaos run cuts a runner off from its store.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (cut2, conns2) = (Arc::clone(&cut), Arc::clone(&conns));
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                if cut2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let mut list = conns2.lock().unwrap_or_else(|p| p.into_inner());
                list.retain(|s| s.peer_addr().is_ok());
                for s in [&client, &server] {
                    if let Ok(clone) = s.try_clone() {
                        list.push(clone);
                    }
                }
                drop(list);
                for (mut from, mut to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ]
                .into_iter()
                .filter_map(|(a, b)| Some((a.ok()?, b.ok()?)))
                {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, cut, conns }
    }

    /// Cuts every connection through the proxy and refuses new ones
    /// (`true`), or lets them through again (`false`).
    pub fn set_cut(&self, on: bool) {
        self.cut.store(on, Ordering::SeqCst);
        if on {
            for s in self
                .conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .drain(..)
            {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}
