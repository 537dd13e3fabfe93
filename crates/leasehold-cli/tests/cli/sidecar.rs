//! `leasehold sidecar`: real sidecar processes on a SQLite store, asked
//! over TCP and over their unix sockets.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use leasehold_testkit::shared::{self, unique};

use super::harness::{Proc, Scratch, leasehold, stderr, wait_until};
use super::operability::free_addr;

const SECOND: Duration = Duration::from_secs(1);

/// Where a sidecar answers.
#[derive(Clone)]
enum At {
    Tcp(SocketAddr),
    Socket(PathBuf),
}

/// How long a request waits for its answer: longer than the sidecar's
/// own bound on a transfer (10 s), which answers only once it is over.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

/// One HTTP/1.1 request: status code and body.
fn request(at: &At, method: &str, path: &str, headers: &str) -> Option<(u16, String)> {
    let text = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let mut response = String::new();
    match at {
        At::Tcp(addr) => {
            let mut stream = TcpStream::connect_timeout(addr, SECOND).ok()?;
            stream.set_read_timeout(Some(ANSWER_WITHIN)).ok()?;
            stream.write_all(text.as_bytes()).ok()?;
            stream.read_to_string(&mut response).ok()?;
        }
        At::Socket(path) => {
            let mut stream = UnixStream::connect(path).ok()?;
            stream.set_read_timeout(Some(ANSWER_WITHIN)).ok()?;
            stream.write_all(text.as_bytes()).ok()?;
            stream.read_to_string(&mut response).ok()?;
        }
    }
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

fn get(at: &At, path: &str) -> Option<(u16, String)> {
    request(at, "GET", path, "")
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"))
}

/// `/leader`'s code, or 0 when the sidecar does not answer.
fn leader_code(at: &At) -> u16 {
    get(at, "/leader").map_or(0, |(code, _)| code)
}

fn sidecar(scratch: &Scratch, id: &str, extra: &[&str]) -> Proc {
    sidecar_on(&scratch.store_url(), scratch, id, extra)
}

/// A sidecar of election `web` on `store`, logging into `scratch`.
fn sidecar_on(store: &str, scratch: &Scratch, id: &str, extra: &[&str]) -> Proc {
    Proc::spawn(
        leasehold()
            .args(["sidecar", "--election", "web", "--id", id, "--ttl", "3s"])
            .args(["--store", store])
            .args(extra)
            .stderr(std::fs::File::create(scratch.path(&format!("{id}.log"))).expect("log")),
    )
}

fn tcp_sidecar(scratch: &Scratch, id: &str, extra: &[&str]) -> (Proc, At) {
    tcp_sidecar_on(&scratch.store_url(), scratch, id, extra)
}

fn tcp_sidecar_on(store: &str, scratch: &Scratch, id: &str, extra: &[&str]) -> (Proc, At) {
    let addr = free_addr();
    let mut args = vec!["--http".to_owned(), addr.to_string()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (sidecar_on(store, scratch, id, &args), At::Tcp(addr))
}

/// A sidecar of election `web` on `scratch`'s store with `args`, which
/// must exit with `code` and, when `needle` is given, one line holding it.
fn refused(scratch: &Scratch, args: &[&str], code: i32, needle: Option<&str>) {
    let out = leasehold()
        .args([
            "sidecar",
            "--election",
            "web",
            "--store",
            &scratch.store_url(),
        ])
        .args(args)
        .output()
        .expect("run");
    let shown = stderr(&out);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {shown}");
    if let Some(needle) = needle {
        assert!(shown.contains(needle), "{args:?}: {shown}");
        assert_eq!(shown.lines().count(), 1, "{args:?}: {shown}");
    }
}

fn wait_for_code(at: &At, path: &str, code: u16) -> bool {
    wait_until(10 * SECOND, || {
        get(at, path).is_some_and(|(c, _)| c == code)
    })
}

#[test]
fn only_the_leaders_sidecar_answers_200_and_another_takes_over_on_sigterm() {
    let scratch = Scratch::new();
    only_the_leader_answers_200(&scratch.store_url(), &scratch);
}

#[test]
fn sidecars_hand_over_on_etcd() {
    let cluster = shared::etcd();
    only_the_leader_answers_200(&cluster.url(&unique("/sidecar")), &Scratch::new());
}

#[test]
fn sidecars_hand_over_on_zookeeper() {
    let server = shared::zookeeper();
    only_the_leader_answers_200(&server.url(&unique("/sidecar")), &Scratch::new());
}

#[test]
fn sidecars_hand_over_on_postgres() {
    let server = shared::postgres();
    let store = format!("{}?schema={}", server.url(), unique("sidecar"));
    only_the_leader_answers_200(&store, &Scratch::new());
}

/// Hooks that append `elected TOKEN` and `deposed TOKEN` to a file of
/// `id`'s: the file, and the flags.
fn hooked(scratch: &Scratch, id: &str) -> (PathBuf, Vec<String>) {
    let log = scratch.path(&format!("{id}.hooks"));
    let hook = |change: &str| format!("echo \"{change} $LEASEHOLD_TOKEN\" >> {}", log.display());
    let flags = vec![
        "--on-elected".to_owned(),
        hook("elected"),
        "--on-deposed".to_owned(),
        hook("deposed"),
    ];
    (log, flags)
}

/// What every endpoint of a leader `a` and a follower `b` answers, on
/// any store; the leader's token.
fn leader_and_follower_answer(at_a: &At, at_b: &At) -> u64 {
    let (code, body) = get(at_a, "/leader").expect("a answers");
    let led = json(&body);
    assert_eq!(
        (code, led["id"].as_str(), led["leading"].as_bool()),
        (200, Some("a"), Some(true))
    );
    let valid_for = led["valid_for_ms"].as_u64().expect("valid_for_ms");
    assert!(valid_for > 0 && valid_for <= 3000, "{valid_for}");
    let (code, body) = get(at_b, "/leader").expect("b answers");
    let follows = json(&body);
    assert_eq!(code, 503);
    assert_eq!(follows["leader"].as_str(), Some("a"), "{follows}");
    assert_eq!(
        follows["token"],
        Value::Null,
        "no token for a follower: {follows}"
    );
    assert_eq!(get(at_a, "/follower").map(|(c, _)| c), Some(503));
    for method in ["HEAD", "OPTIONS"] {
        let code = |at| request(at, method, "/leader", "").map(|(c, _)| c);
        assert_eq!((code(at_a), code(at_b)), (Some(200), Some(503)), "{method}");
    }
    assert_eq!(get(at_a, "/health").map(|(c, _)| c), Some(200));
    // The gauge follows a watch of the line: it may lag the line by a
    // moment on a loaded machine.
    let mut metrics = String::new();
    let one_waits = wait_until(Duration::from_secs(10), || {
        metrics = get(at_a, "/metrics").map(|(_, m)| m).unwrap_or_default();
        metrics
            .lines()
            .any(|l| l.starts_with("leasehold_waiting_candidates{") && l.ends_with(" 1"))
    });
    assert!(one_waits, "{metrics}");
    assert_eq!(get(at_a, "/nowhere").map(|(c, _)| c), Some(404));
    assert_eq!(
        request(at_a, "DELETE", "/leader", "").map(|(c, _)| c),
        Some(405)
    );
    let (code, page) = get(at_a, "/").expect("the page");
    assert!(code == 200 && page.starts_with("<!doctype html>"), "{code}");
    led["token"].as_u64().expect("a token")
}

/// Two sidecars on `store`: only the leader's answers 200, the other
/// follows; SIGTERM hands over, and the old one never answers 200 again.
/// Hooks run and `/watch` reports the change, on every store.
fn only_the_leader_answers_200(store: &str, scratch: &Scratch) {
    let (a_hooks, a_args) = hooked(scratch, "a");
    let (b_hooks, b_args) = hooked(scratch, "b");
    let a_args: Vec<&str> = a_args.iter().map(String::as_str).collect();
    let b_args: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let (mut a, at_a) = tcp_sidecar_on(store, scratch, "a", &a_args);
    assert!(wait_for_code(&at_a, "/leader", 200), "a never led");
    let (_b, at_b) = tcp_sidecar_on(store, scratch, "b", &b_args);
    assert!(wait_for_code(&at_b, "/follower", 200), "b never followed");
    let token_a = leader_and_follower_answer(&at_a, &at_b);
    let At::Tcp(addr_b) = &at_b else {
        unreachable!("a TCP sidecar")
    };
    let watch_b = Watch::open(*addr_b);
    assert_eq!(watch_b.next().1["leading"].as_bool(), Some(false));
    a.signal(Signal::SIGTERM);
    let gained = watch_b.find(|name, data| name == "leadership" && data["change"] == "gained");
    assert!(gained["token"].as_u64() > Some(token_a), "{gained}");
    assert!(wait_for_code(&at_b, "/leader", 200), "b never took over");
    // Once b answers 200, a never does again.
    for _ in 0..20 {
        assert_ne!(leader_code(&at_a), 200, "a answered 200 after b led");
    }
    let (_, body) = get(&at_b, "/leader").expect("b answers");
    let token_b = json(&body)["token"].as_u64().expect("b's token");
    assert!(token_b > token_a, "{body}");
    assert!(a.wait_for_exit(5 * SECOND).is_some_and(|s| s.success()));
    // a's hooks ran before it exited; b's elected hook runs beside it.
    let lines = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    assert_eq!(
        lines(&a_hooks),
        format!("elected {token_a}\ndeposed {token_a}\n")
    );
    assert!(wait_until(5 * SECOND, || lines(&b_hooks)
        == format!("elected {token_b}\n")));
}

#[test]
fn the_socket_is_private_replaces_a_stale_one_and_refuses_other_files() {
    let scratch = Scratch::new();
    let path = scratch.path("a.sock");
    // A regular file is left as it is.
    std::fs::write(&path, "mine").expect("write");
    let socket = path.to_str().expect("utf-8");
    refused(
        &scratch,
        &["--socket", socket],
        1,
        Some("is a file that is not a socket"),
    );
    assert_eq!(std::fs::read_to_string(&path).expect("kept"), "mine");
    std::fs::remove_file(&path).expect("remove");
    // A socket nobody serves on (a killed sidecar's) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
    let mut a = sidecar(&scratch, "a", &["--socket", path.to_str().expect("utf-8")]);
    let at = At::Socket(path.clone());
    assert!(wait_for_code(&at, "/leader", 200), "a never led");
    let mode = std::fs::metadata(&path)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // A socket another sidecar serves on is refused.
    refused(
        &scratch,
        &["--socket", socket],
        1,
        Some("another process serves on it"),
    );
    assert_eq!(leader_code(&at), 200, "the first sidecar still answers");
    a.signal(Signal::SIGTERM);
    assert!(a.wait_for_exit(5 * SECOND).is_some());
    assert!(!path.exists(), "the socket is removed on exit");
    assert_only(
        scratch.dir.path(),
        &["a.log", "leasehold.db", "leasehold.db-notify"],
    );
}

/// Nothing but `names` in `dir` (no staging folder left behind).
fn assert_only(dir: &Path, names: &[&str]) {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert_eq!(found, names, "{found:?}");
}

#[test]
fn admin_calls_need_the_socket_or_the_token_and_move_leadership() {
    let scratch = Scratch::new();
    let token = "s3cret-admin-token-0123456789";
    let token_file = scratch.path("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write");
    let socket = scratch.path("a.sock");
    let (_a, at_a) = tcp_sidecar(
        &scratch,
        "a",
        &[
            "--socket",
            socket.to_str().expect("utf-8"),
            "--admin-token-file",
            token_file.to_str().expect("utf-8"),
        ],
    );
    assert!(wait_for_code(&at_a, "/leader", 200), "a never led");
    let (_b, at_b) = tcp_sidecar(&scratch, "b", &[]);
    assert!(wait_for_code(&at_b, "/follower", 200), "b never followed");
    // b's TCP listener has no token file: admin calls are refused there.
    assert_eq!(
        request(&at_b, "POST", "/resign", "").map(|(c, _)| c),
        Some(403)
    );
    for headers in ["", "Authorization: Bearer wrong-token-0123456789\r\n"] {
        let (code, body) = request(&at_a, "POST", "/resign", headers).expect("answers");
        assert_eq!(code, 401, "{body}");
        assert!(!body.contains(token), "{body}");
    }
    assert_eq!(leader_code(&at_a), 200, "a refused call changes nothing");
    let bearer = format!("Authorization: bearer {token}\r\n");
    for bad in ["/transfer?to=%ZZ", "/transfer?x=1", "/resign?x=1"] {
        let (code, body) = request(&at_a, "POST", bad, &bearer).expect("answers");
        assert_eq!(code, 400, "{bad}: {body}");
    }
    let (code, body) = request(&at_a, "POST", "/transfer?to=b", &bearer).expect("answers");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("b leads now"), "{body}");
    assert_eq!(leader_code(&at_b), 200);
    // Over the socket, no token is needed: resigning as a follower is
    // refused; the leader's /transfer to a moves it back.
    let at_socket = At::Socket(socket);
    let (code, body) = request(&at_socket, "POST", "/resign", "").expect("answers");
    assert_eq!(code, 409, "{body}");
    // a waits in line again only once its campaign put its note there
    // (CI once asked before, and b answered that nobody waits): a move to
    // it is refused, changing nothing, until then.
    let mut moved = None;
    let asked = std::time::Instant::now();
    while asked.elapsed() < std::time::Duration::from_secs(10) {
        let (code, body) = request(&at_socket, "POST", "/transfer?to=a", "").expect("answers");
        moved = Some((code, body));
        if code != 409 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (code, body) = moved.expect("asked");
    assert_eq!(code, 200, "{body}");
    assert_eq!(leader_code(&at_a), 200);
    // Resigning hands over to whoever waits: b, once it is back in line
    // (else a, alone in the line, is granted again at once).
    assert!(wait_for_code(&at_b, "/follower", 200), "b never followed");
    let (code, body) = request(&at_socket, "POST", "/resign", "").expect("answers");
    assert_eq!(code, 200, "{body}");
    assert!(
        wait_for_code(&at_b, "/leader", 200),
        "b never took over after a resigned: {}\n{}",
        std::fs::read_to_string(scratch.path("a.log")).unwrap_or_default(),
        std::fs::read_to_string(scratch.path("b.log")).unwrap_or_default()
    );
    let (code, body) = request(&at_socket, "POST", "/transfer?to=nobody", "").expect("answers");
    assert_eq!(code, 409, "{body}");
    for id in ["a", "b"] {
        let log = std::fs::read_to_string(scratch.path(&format!("{id}.log"))).expect("log");
        assert!(!log.contains(token), "{log}");
    }
}

#[test]
fn hooks_run_with_the_token_and_a_hanging_one_is_killed_without_harm() {
    let scratch = Scratch::new();
    let record = scratch.path("hooks");
    let elected = format!(
        "echo elected $LEASEHOLD_ELECTION $LEASEHOLD_ID $LEASEHOLD_TOKEN >> {}; sleep 100",
        record.display()
    );
    let left = scratch.path("left");
    let deposed = format!(
        "echo deposed $LEASEHOLD_TOKEN \"$LEASEHOLD_REASON\" >> {}; sleep 300 & echo $! > {}",
        record.display(),
        left.display()
    );
    let (mut a, at_a) = tcp_sidecar(
        &scratch,
        "a",
        &[
            "--on-elected",
            &elected,
            "--on-deposed",
            &deposed,
            "--hook-timeout",
            "500ms",
        ],
    );
    assert!(wait_for_code(&at_a, "/leader", 200), "a never led");
    // Past the TTL: the hanging hook was killed at its timeout, and
    // leadership went on meanwhile.
    std::thread::sleep(4 * SECOND);
    assert_eq!(leader_code(&at_a), 200);
    let log = std::fs::read_to_string(scratch.path("a.log")).expect("log");
    assert!(
        log.contains("the hook did not finish in time; killed"),
        "{log}"
    );
    a.signal(Signal::SIGTERM);
    assert!(a.wait_for_exit(5 * SECOND).is_some());
    assert!(
        wait_until(5 * SECOND, || std::fs::read_to_string(&record)
            .is_ok_and(|r| r.lines().count() == 2)),
        "{:?}",
        std::fs::read_to_string(&record)
    );
    let lines = std::fs::read_to_string(&record).expect("record");
    assert_eq!(
        lines, "elected web a 1\ndeposed 1 SIGTERM received\n",
        "in order, with the token"
    );
    // What the hook left running in its process group went with it.
    let pid: i32 = std::fs::read_to_string(&left)
        .expect("the hook's child's pid")
        .trim()
        .parse()
        .expect("a pid");
    assert!(
        wait_until(5 * SECOND, || !super::harness::alive(pid)),
        "the hook's child {pid} still runs"
    );
}

/// On SQLite a dead holder's process is found at once; a sidecar's
/// server outlives it, so its last 200 must stay the only one until its
/// `valid_for_ms` is over.
#[test]
fn a_killed_sidecars_last_answer_stays_the_only_200_until_it_runs_out() {
    let scratch = Scratch::new();
    let (a, at_a) = tcp_sidecar(&scratch, "a", &[]);
    assert!(wait_for_code(&at_a, "/leader", 200), "a never led");
    let (_b, at_b) = tcp_sidecar(&scratch, "b", &[]);
    assert!(wait_for_code(&at_b, "/follower", 200), "b never followed");
    let asked = std::time::Instant::now();
    let (code, body) = get(&at_a, "/leader").expect("a answers");
    assert_eq!(code, 200, "{body}");
    let valid_for = Duration::from_millis(json(&body)["valid_for_ms"].as_u64().expect("ms"));
    a.signal(Signal::SIGKILL);
    assert!(
        wait_until(15 * SECOND, || leader_code(&at_b) == 200),
        "b never took over"
    );
    let took_over = asked.elapsed();
    assert!(
        took_over >= valid_for,
        "b answered 200 {took_over:?} after a's 200 that was valid for {valid_for:?}"
    );
}

#[test]
fn a_transfer_to_a_replica_that_does_not_take_it_up_is_not_reported_done() {
    let scratch = Scratch::new();
    let socket = scratch.path("a.sock");
    let (_a, at_a) = tcp_sidecar(
        &scratch,
        "a",
        &["--socket", socket.to_str().expect("utf-8")],
    );
    assert!(wait_for_code(&at_a, "/leader", 200), "a never led");
    let (b, at_b) = tcp_sidecar(&scratch, "b", &[]);
    assert!(wait_for_code(&at_b, "/follower", 200), "b never followed");
    b.signal(Signal::SIGSTOP);
    let answer = request(&At::Socket(socket), "POST", "/transfer?to=b", "");
    b.signal(Signal::SIGCONT);
    let (code, body) = answer.expect("answers");
    assert_ne!(code, 200, "{body}");
    assert!(!body.contains("\"done\""), "{body}");
}

#[test]
fn a_sidecar_needs_somewhere_to_answer_and_a_free_port() {
    let scratch = Scratch::new();
    refused(
        &scratch,
        &[],
        2,
        Some("give --http ADDR, --socket PATH or both"),
    );
    let short = scratch.path("short-token");
    std::fs::write(&short, "too short\n").expect("write");
    let short = short.to_str().expect("utf-8");
    let missing = scratch.path("no-such-token");
    let missing = missing.to_str().expect("utf-8");
    for bad in [
        ["--hook-timeout", "0s"],
        ["--on-elected", " "],
        ["--admin-token-file", short],
        ["--admin-token-file", missing],
    ] {
        refused(
            &scratch,
            &[&["--http", "127.0.0.1:1"][..], &bad[..]].concat(),
            2,
            None,
        );
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    refused(
        &scratch,
        &["--http", &addr],
        1,
        Some("another process listens there"),
    );
}

/// The events of a `/watch` stream, read by a thread of its own, after
/// the `history` it starts with.
struct Watch {
    events: std::sync::mpsc::Receiver<(String, Value)>,
    history: Value,
}

impl Watch {
    fn open(addr: SocketAddr) -> Self {
        use std::io::BufRead;
        let mut stream = TcpStream::connect_timeout(&addr, SECOND).expect("connect");
        write!(stream, "GET /watch HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("ask");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut name = String::new();
            for line in std::io::BufReader::new(stream).lines() {
                let Ok(line) = line else { return };
                if let Some(event) = line.strip_prefix("event: ") {
                    name = event.to_owned();
                } else if let Some(data) = line.strip_prefix("data: ")
                    && let Ok(data) = serde_json::from_str(data)
                    && tx.send((name.clone(), data)).is_err()
                {
                    return;
                }
            }
        });
        let (name, history) = rx.recv_timeout(10 * SECOND).expect("the history");
        assert_eq!(name, "history", "{history}");
        Watch {
            events: rx,
            history,
        }
    }

    /// The next event, within a few seconds.
    fn next(&self) -> (String, Value) {
        self.events
            .recv_timeout(10 * SECOND)
            .expect("an event within 10 s")
    }

    /// Every event for up to 10 s until one that `wanted` accepts: those
    /// before it, and it.
    fn until(&self, wanted: impl Fn(&str, &Value) -> bool) -> Vec<(String, Value)> {
        let limit = std::time::Instant::now() + 10 * SECOND;
        let mut seen = Vec::new();
        loop {
            let left = limit.saturating_duration_since(std::time::Instant::now());
            let Ok((name, data)) = self.events.recv_timeout(left) else {
                panic!("no such event within 10 s; saw {seen:?}");
            };
            let found = wanted(&name, &data);
            seen.push((name, data));
            if found {
                return seen;
            }
        }
    }

    /// The data of the first event `wanted` accepts, within 10 s.
    fn find(&self, wanted: impl Fn(&str, &Value) -> bool) -> Value {
        let mut seen = self.until(wanted);
        seen.pop().map(|(_, data)| data).unwrap_or_default()
    }
}

#[test]
fn watch_streams_the_state_first_then_each_change() {
    let scratch = Scratch::new();
    let (a, at_a) = tcp_sidecar(&scratch, "a", &[]);
    assert!(wait_for_code(&at_a, "/leader", 200), "a never led");
    let (_b, at_b) = tcp_sidecar(&scratch, "b", &[]);
    assert!(wait_for_code(&at_b, "/follower", 200), "b never followed");
    let (At::Tcp(addr_a), At::Tcp(addr_b)) = (&at_a, &at_b) else {
        unreachable!("TCP sidecars")
    };
    // Connected late: the state comes first.
    let watch_a = Watch::open(*addr_a);
    let (name, state) = watch_a.next();
    assert_eq!(name, "leadership");
    assert_eq!(
        (state["change"].as_str(), state["leading"].as_bool()),
        (Some("state"), Some(true)),
        "{state}"
    );
    let token_a = state["token"].as_u64().expect("a's token");
    assert_eq!(
        watch_a.next(),
        (
            "leader".to_owned(),
            serde_json::json!({"leader": "a", "token": token_a})
        )
    );
    let watch_b = Watch::open(*addr_b);
    let (_, state) = watch_b.next();
    assert_eq!(state["leading"].as_bool(), Some(false), "{state}");
    // Renewals are reported (TTL 3s: one a second), with the time left
    // after the renewal (about 2.8 s), not before it (about 1.8 s).
    let renewed = watch_a.find(|name, data| name == "leadership" && data["change"] == "renewed");
    assert!(
        renewed["valid_for_ms"].as_u64().is_some_and(|ms| ms > 2300),
        "{renewed}"
    );
    a.signal(Signal::SIGTERM);
    let lost = watch_a.find(|name, data| name == "leadership" && data["change"] == "lost");
    assert_eq!(lost["reason"].as_str(), Some("SIGTERM received"), "{lost}");
    assert_eq!(lost["token"].as_u64(), Some(token_a), "{lost}");
    // b's gain and the new leader come in either order.
    let mut seen = watch_b.until(|name, data| name == "leadership" && data["change"] == "gained");
    let gained = seen
        .last()
        .map(|(_, data)| data.clone())
        .unwrap_or_default();
    assert!(gained["token"].as_u64() > Some(token_a), "{gained}");
    if !seen
        .iter()
        .any(|(name, data)| name == "leader" && data["leader"] == "b")
    {
        seen = watch_b.until(|name, data| name == "leader" && data["leader"] == "b");
    }
    let leader = seen
        .iter()
        .find(|(name, data)| name == "leader" && data["leader"] == "b")
        .map(|(_, data)| data.clone())
        .unwrap_or_default();
    assert_eq!(leader["token"], gained["token"], "{leader}");
    // A client that connects now is told what happened, with its times:
    // b saw a lead, then b gained and led (those two in either order).
    let past = Watch::open(*addr_b).history;
    let past = past.as_array().expect("an array");
    let seen: Vec<String> = past
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["event"],
                e["leader"].as_str().or(e["change"].as_str()).unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        seen.first().map(String::as_str),
        Some("\"leader\" a"),
        "{seen:?}"
    );
    assert!(
        seen.contains(&"\"leadership\" gained".to_owned()),
        "{seen:?}"
    );
    assert!(seen.contains(&"\"leader\" b".to_owned()), "{seen:?}");
    assert!(!seen.iter().any(|s| s.contains("renewed")), "{seen:?}");
    let times: Vec<u64> = past.iter().filter_map(|e| e["at_ms"].as_u64()).collect();
    assert_eq!(times.len(), past.len(), "{past:?}");
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
}

#[test]
fn oversized_requests_are_refused_and_the_sidecar_goes_on() {
    let scratch = Scratch::new();
    let (_a, at_a) = tcp_sidecar(&scratch, "a", &[]);
    assert!(wait_for_code(&at_a, "/leader", 200), "a never led");
    let big = format!("X-Big: {}\r\n", "a".repeat(500_000));
    assert_eq!(
        request(&at_a, "GET", "/leader", &big).map(|(c, _)| c),
        Some(431)
    );
    let many: String = (0..200).map(|i| format!("X-{i}: 1\r\n")).collect();
    assert_eq!(
        request(&at_a, "GET", "/leader", &many).map(|(c, _)| c),
        Some(431)
    );
    assert_eq!(leader_code(&at_a), 200);
}

/// `/leader` is decided from the deadline, not from the store: with the
/// store gone, a 200 is never answered past the deadline of an earlier
/// one, and 503 comes by the TTL.
#[test]
fn a_sidecar_answers_503_from_its_deadline_while_postgres_is_down() {
    let mut server = leasehold_testkit::PostgresServer::start();
    let store = format!("{}?schema=sidecar", server.url());
    let scratch = Scratch::new();
    let (_a, at_a) = tcp_sidecar_on(&store, &scratch, "a", &[]);
    assert!(wait_for_code(&at_a, "/leader", 200), "a never led");
    server.stop_fast();
    let stopped = std::time::Instant::now();
    // The latest end of a 200's validity, counted from when it was asked.
    let mut valid_until: Option<std::time::Instant> = None;
    let mut first_503: Option<std::time::Instant> = None;
    while stopped.elapsed() < 6 * SECOND {
        let sent = std::time::Instant::now();
        match get(&at_a, "/leader") {
            Some((200, body)) => {
                assert!(
                    first_503.is_none(),
                    "a 200 after a 503, the store down: {body}"
                );
                let ms = json(&body)["valid_for_ms"].as_u64().expect("valid_for_ms");
                let end = sent + Duration::from_millis(ms);
                assert!(end <= stopped + 3 * SECOND, "valid past the TTL: {body}");
                valid_until = Some(valid_until.map_or(end, |v| v.max(end)));
            }
            Some((503, _)) => {
                first_503.get_or_insert(sent);
            }
            other => panic!("{other:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let first_503 = first_503.expect("a 503 within 6 s of the outage");
    // Within one poll of the last deadline, and by the TTL.
    let poll = Duration::from_millis(100);
    assert!(
        first_503 <= stopped + 3 * SECOND + poll,
        "{:?}",
        first_503 - stopped
    );
    if let Some(valid_until) = valid_until {
        assert!(
            first_503 <= valid_until + poll,
            "503 late by {:?}",
            first_503 - valid_until
        );
    }
}

/// A sidecar and a `run` of one election hand leadership to each other
/// with `leasehold transfer`.
#[test]
fn transfer_moves_leadership_between_a_sidecar_and_a_runner() {
    let scratch = Scratch::new();
    let (_a, at_a) = tcp_sidecar(&scratch, "a", &[]);
    assert!(wait_for_code(&at_a, "/leader", 200), "a never led");
    let started = scratch.path("started");
    let script = format!(
        "echo $LEASEHOLD_TOKEN >> {}; exec sleep 100",
        started.display()
    );
    let _b = Proc::spawn(
        leasehold()
            .args(["run", "--election", "web", "--id", "b", "--ttl", "3s"])
            .args(["--store", &scratch.store_url(), "--", "sh", "-c", &script])
            .stderr(Stdio::null()),
    );
    let transfer = |to: &str| {
        leasehold()
            .args(["transfer", "--election", "web", "--to", to])
            .args(["--store", &scratch.store_url()])
            .output()
            .expect("transfer")
    };
    assert!(
        wait_until(10 * SECOND, || transfer("b").status.success()),
        "no transfer to the runner"
    );
    assert!(
        wait_until(5 * SECOND, || started.exists()),
        "the runner's command did not start"
    );
    assert_eq!(leader_code(&at_a), 503);
    let out = transfer("a");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(leader_code(&at_a), 200);
}

/// Descriptors `pid` holds open.
fn open_descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// The descriptors of `pid` once their count holds still for 50 ms (at
/// most 5 s): the connection of a request just answered may still be
/// closing. Counted while it was open, the count never came back up to
/// it plus the connections made, and each batch below waited out its 5 s
/// (the test took 62 s instead of 2).
fn settled_descriptors(pid: i32) -> usize {
    let mut last = open_descriptors(pid);
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = open_descriptors(pid);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

#[test]
fn idle_connections_cannot_take_every_descriptor_and_the_socket_still_answers() {
    let scratch = Scratch::new();
    let socket = scratch.path("a.sock");
    let socket_arg = socket.to_str().expect("utf-8").to_owned();
    let (a, at) = tcp_sidecar(&scratch, "a", &["--socket", &socket_arg]);
    assert!(wait_for_code(&at, "/leader", 200), "a never led");
    let At::Tcp(addr) = at else {
        unreachable!("a TCP sidecar")
    };
    let before = settled_descriptors(a.pid());
    // More connections than a listener holds (512), none sending anything,
    // a batch at a time: each waits until the sidecar has taken the last
    // (up to the cap), so that a busy machine's slow accepts do not fill
    // the kernel's queue first.
    let mut idle: Vec<TcpStream> = Vec::new();
    while idle.len() < 600 {
        for _ in 0..50 {
            idle.push(TcpStream::connect_timeout(&addr, 5 * SECOND).expect("connect"));
        }
        let taken = before + idle.len().min(512);
        wait_until(5 * SECOND, || open_descriptors(a.pid()) >= taken);
    }
    let reached = wait_until(2 * SECOND, || open_descriptors(a.pid()) >= before + 600);
    let held = open_descriptors(a.pid());
    assert!(
        !reached && held < before + 600,
        "{held} descriptors (from {before})"
    );
    // The socket has a cap of its own: the admin path still answers, and
    // the replica still leads.
    assert_eq!(
        get(&At::Socket(socket.clone()), "/leader").map(|(c, _)| c),
        Some(200)
    );
    drop(idle);
    assert!(
        wait_for_code(&at, "/leader", 200),
        "TCP never answered again"
    );
}
