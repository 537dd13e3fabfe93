//! The page on `/` of `sidecar --http` and `run --http`, in a real
//! headless browser (Debian's Chromium), driven over the DevTools protocol
//! on a pipe: it renders the election, and it follows a transfer without a
//! reload.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use super::harness::{Proc, Scratch, leasehold, transferred, wait_until};
use super::operability::{free_addr, get};

const SECOND: Duration = Duration::from_secs(1);

fn chromium() -> PathBuf {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("chromium"))
}

/// A headless Chromium, spoken to over `--remote-debugging-pipe`: the
/// browser reads commands on its descriptor 3 and writes answers and
/// events on 4, each a JSON message ended by a NUL byte. `sh` hands it
/// our stdin pipe as 3 and our stdout pipe as 4.
struct Browser {
    _process: Proc,
    commands: ChildStdin,
    messages: mpsc::Receiver<Value>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Self {
        let profile = tempfile::tempdir().expect("a profile folder");
        let mut command = Command::new("sh");
        command
            .args(["-c", r#"exec "$@" 3<&0 4>&1 0</dev/null 1>/dev/null"#, "sh"])
            .arg(chromium())
            .args(["--headless=new", "--no-sandbox", "--disable-gpu"])
            .args(["--no-first-run", "--disable-extensions"])
            .args(["--remote-debugging-pipe", "about:blank"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut process = Proc::spawn(&mut command);
        let commands = process.child.stdin.take().expect("stdin");
        let out = process.child.stdout.take().expect("stdout");
        let (sender, messages) = mpsc::channel();
        std::thread::spawn(move || {
            for message in BufReader::new(out).split(0).map_while(Result::ok) {
                if let Ok(value) = serde_json::from_slice::<Value>(&message)
                    && sender.send(value).is_err()
                {
                    return;
                }
            }
        });
        Browser {
            _process: process,
            commands,
            messages,
            next_id: 0,
            _profile: profile,
        }
    }

    /// Sends one command (to a page when `session` is given) and returns
    /// its result; panics on an error or after 20 s.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let mut message = json!({"id": self.next_id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).expect("JSON");
        bytes.push(0);
        self.commands
            .write_all(&bytes)
            .expect("write to the browser");
        loop {
            let answer = self
                .messages
                .recv_timeout(20 * SECOND)
                .unwrap_or_else(|_| panic!("the browser did not answer {method}"));
            if answer["id"] == json!(self.next_id) {
                assert!(answer["error"].is_null(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    /// Opens `url` in a new tab; the session to speak to it.
    fn open(&mut self, url: &str) -> String {
        let target = self.call(None, "Target.createTarget", json!({"url": url}));
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_owned()
    }

    /// The value of `expression` in the page of `session`.
    fn eval(&mut self, session: &str, expression: &str) -> Value {
        let result = self.call(
            Some(session),
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        result["result"]["value"].clone()
    }

    /// The text of the element `id`, "" while there is none.
    fn text(&mut self, session: &str, id: &str) -> String {
        let expression = format!("document.getElementById({id:?})?.textContent ?? ''");
        self.eval(session, &expression)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Waits up to 10 s until element `id` reads `expected`.
    fn shows(&mut self, session: &str, id: &str, expected: &str) -> bool {
        wait_until(10 * SECOND, || self.text(session, id) == expected)
    }
}

fn wait_for(addr: SocketAddr, path: &str) -> bool {
    wait_until(10 * SECOND, || {
        get(addr, path).is_some_and(|(c, _)| c == 200)
    })
}

#[test]
fn the_page_follows_a_transfer_in_a_browser_without_a_reload() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let (at_a, at_b) = (free_addr(), free_addr());
    let _a = Proc::spawn(
        leasehold()
            .args(["sidecar", "-e", "web", "--id", "a", "--ttl", "3s"])
            .args(["--store", &store, "--http", &at_a.to_string()])
            .stderr(Stdio::null()),
    );
    assert!(wait_for(at_a, "/leader"), "a never led");
    // b is a runner: the page is the same on `run --http`.
    let _b = Proc::spawn(
        leasehold()
            .args(["run", "-e", "web", "--id", "b", "--ttl", "3s"])
            .args(["--store", &store, "--http", &at_b.to_string()])
            .args(["--", "sleep", "100"])
            .stderr(Stdio::null()),
    );
    assert!(wait_for(at_b, "/healthz"), "b never served");

    let mut browser = Browser::start();
    let page_a = browser.open(&format!("http://{at_a}/"));
    let page_b = browser.open(&format!("http://{at_b}/"));
    for page in [&page_a, &page_b] {
        assert!(browser.shows(page, "election", "web"));
        assert!(browser.shows(page, "leader", "a"));
        assert!(browser.shows(page, "line", "b"), "b waits in line");
    }
    assert!(browser.shows(&page_a, "me", "a"));
    assert!(browser.shows(&page_a, "state", "leading"));
    assert!(browser.shows(&page_b, "me", "b"));
    assert!(browser.shows(&page_b, "state", "not leading"));
    let token_a: u64 = browser.text(&page_a, "token").parse().expect("a token");
    // A mark that a reload would wipe.
    for page in [&page_a, &page_b] {
        browser.eval(page, "window.notReloaded = true");
    }

    transferred(&store, "web", "b");
    for page in [&page_a, &page_b] {
        assert!(browser.shows(page, "leader", "b"));
        assert!(browser.shows(page, "line", "a"), "a waits in line");
        let token: u64 = browser.text(page, "token").parse().expect("b token");
        assert!(token > token_a, "{token} after {token_a}");
        assert_eq!(browser.eval(page, "window.notReloaded"), json!(true));
    }
    assert!(browser.shows(&page_a, "state", "not leading"));
    assert!(browser.shows(&page_b, "state", "leading"));
    let timeline = browser.text(&page_a, "timeline");
    assert!(timeline.contains("stepped down"), "{timeline}");
    assert!(timeline.contains("handed over"), "{timeline}");
    assert!(
        browser
            .text(&page_b, "timeline")
            .contains("this replica leads")
    );
    // Opened after the transfer, a's page shows it in its timeline too.
    // Its timeline is drawn from /watch's history once that answers.
    let late = browser.open(&format!("http://{at_a}/"));
    assert!(browser.shows(&late, "leader", "b"));
    let mut timeline = String::new();
    let shown = wait_until(10 * SECOND, || {
        timeline = browser.text(&late, "timeline");
        timeline.contains("stepped down") && timeline.contains("b leads")
    });
    assert!(shown, "{timeline}");
}
