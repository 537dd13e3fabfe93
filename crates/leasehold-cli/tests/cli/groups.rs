//! Many responsibilities with real processes: `run --shards` and `run
//! --slots`.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use super::harness::{
    Proc, Scratch, leasehold, read_lines, status_json, status_json_once_created, stderr, wait_until,
};

const SECOND: Duration = Duration::from_secs(1);
const GROUP: &str = "jobs";

/// A shard's (or slot's) command: takes an exclusive lock named after its
/// shard — the kernel lets go of it when the process dies, however it
/// dies — and logs `double` if another process still holds it, so a shard
/// ever run twice at once shows in the log whatever killed the other.
/// Logs `start SHARD TOKEN ID` and, on SIGTERM, `stop SHARD TOKEN ID`.
const WORKER: &str = r#"K="${LEASEHOLD_SHARD:-$LEASEHOLD_SLOT}"
exec 9>"lock-$K"
flock -n 9 || echo "double $K $LEASEHOLD_TOKEN $LEASEHOLD_ID" >> moves.log
trap 'echo "stop $K $LEASEHOLD_TOKEN $LEASEHOLD_ID" >> moves.log; exit 0' TERM
echo "start $K $LEASEHOLD_TOKEN $LEASEHOLD_ID $LEASEHOLD_SHARDS$LEASEHOLD_SLOTS $LEASEHOLD_ELECTION $$" >> moves.log
while :; do sleep 0.05 9>&-; done"#;

fn member(store: &str, scratch: &Scratch, id: &str, extra: &[&str]) -> Proc {
    Proc::spawn(
        leasehold()
            .args(["run", "--election", GROUP, "--ttl", "30s", "--id", id])
            .args(["--store", store])
            .args(extra)
            .args(["--", "sh", "-c", WORKER])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// How many shards each of `ids` owns, as `status --json` says, and how
/// many are owned in all.
fn loads(store: &str, ids: &[&str]) -> (Vec<u64>, usize) {
    let status = status_json_once_created(store, GROUP);
    let members = status["group"]["members"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let loads = ids
        .iter()
        .map(|id| {
            members
                .iter()
                .find(|m| m["id"] == *id)
                .and_then(|m| m["owns"].as_u64())
                .unwrap_or(0)
        })
        .collect();
    let owned = status["group"]["owners"]
        .as_array()
        .map_or(0, |o| o.iter().filter(|o| !o["owner"].is_null()).count());
    (loads, owned)
}

/// A command that started: shard, token, replica.
type Started = (String, String, String);

/// Commands running now, from the log: a start not yet followed by a stop
/// of the same shard and token whose process is still there, less `dead`
/// (a SIGKILLed replica's commands never log their stop, and neither does
/// a command killed at once because its grant was lost).
fn running(scratch: &Scratch, dead: &[Started]) -> Vec<Started> {
    let mut now: Vec<(Started, Option<String>)> = Vec::new();
    for line in read_lines(&scratch.path("moves.log")) {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["start", k, token, id, rest @ ..] => {
                let pid = rest.get(2).map(|p| p.to_string());
                now.push(((k.to_string(), token.to_string(), id.to_string()), pid));
            }
            ["stop", k, token, _] => now.retain(|((k2, t2, _), _)| !(k2 == k && t2 == token)),
            _ => {}
        }
    }
    now.into_iter()
        .filter(|(_, pid)| pid.as_ref().is_none_or(|pid| alive(pid)))
        .map(|(started, _)| started)
        .filter(|s| !dead.contains(s))
        .collect()
}

/// Whether process `pid` exists and has not exited (a zombie has).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// No command ran while another held its shard; every shard's tokens grew.
fn assert_never_doubly_owned(scratch: &Scratch) {
    let log = read_lines(&scratch.path("moves.log"));
    assert!(
        !log.iter().any(|l| l.starts_with("double ")),
        "a shard ran twice at once: {log:?}"
    );
    let mut last: std::collections::HashMap<String, u64> = Default::default();
    for line in &log {
        if let ["start", k, token, ..] = line.split(' ').collect::<Vec<_>>().as_slice() {
            let token: u64 = token.parse().expect("token");
            let before = last.insert(k.to_string(), token).unwrap_or(0);
            assert!(
                token > before,
                "shard {k}: token {token} after {before}: {log:?}"
            );
        }
    }
}

fn settled(store: &str, scratch: &Scratch, ids: &[&str], want: &[u64], dead: &[Started]) {
    let total = usize::try_from(want.iter().sum::<u64>()).expect("small");
    assert!(
        wait_until(30 * SECOND, || loads(store, ids) == (want.to_vec(), total)
            && running(scratch, dead).len() == total),
        "{ids:?} did not settle at {want:?}: status says {:?}, running {:?}; log {:?}",
        loads(store, ids),
        running(scratch, dead),
        read_lines(&scratch.path("moves.log"))
    );
}

/// Three replicas share twelve shards 4/4/4; one SIGKILLed leaves 6/6 at
/// once (its guard releases its shards once its commands are gone), with
/// no shard run twice at any instant; restarted, it takes its share back
/// by graceful handover: 4/4/4. SIGTERM stops every command and releases
/// everything.
#[test]
fn twelve_shards_over_three_replicas_survive_a_kill_and_a_restart() {
    let scratch = Scratch::new();
    twelve_shards_over_three_replicas(&scratch.store_url(), &scratch);
}

/// The same on any store (etcd, ZooKeeper and PostgreSQL run it too): the
/// killed replica's guards release its shards and its membership, so the
/// others take them before its session's TTL.
pub fn twelve_shards_over_three_replicas(store: &str, scratch: &Scratch) {
    let (store, scratch) = (store.to_owned(), scratch);
    let a = member(&store, scratch, "a", &["--shards", "12"]);
    let b = member(&store, scratch, "b", &["--shards", "12"]);
    let c = member(&store, scratch, "c", &["--shards", "12"]);
    settled(&store, scratch, &["a", "b", "c"], &[4, 4, 4], &[]);
    let log = read_lines(&scratch.path("moves.log"));
    assert!(
        log.iter()
            .any(|l| l.starts_with("start ") && l.contains(" 12 jobs/shard/0 ")),
        "a shard's command sees LEASEHOLD_SHARDS and its own election: {log:?}"
    );

    // b's commands, alive now: SIGKILLed with b, they never log a stop.
    let dead: Vec<Started> = running(scratch, &[])
        .into_iter()
        .filter(|(_, _, id)| id == "b")
        .collect();
    assert_eq!(dead.len(), 4);
    b.signal(nix::sys::signal::Signal::SIGKILL);
    settled(&store, scratch, &["a", "c"], &[6, 6], &dead);
    assert_never_doubly_owned(scratch);

    let b2 = member(&store, scratch, "b", &["--shards", "12"]);
    settled(&store, scratch, &["a", "b", "c"], &[4, 4, 4], &dead);
    assert_never_doubly_owned(scratch);

    for replica in [&a, &b2, &c] {
        replica.signal(nix::sys::signal::Signal::SIGTERM);
    }
    for mut replica in [a, b2, c] {
        let status = replica.wait_for_exit(30 * SECOND);
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "run --shards exits 0 after SIGTERM"
        );
    }
    let status = status_json(&store, GROUP);
    assert!(
        status["group"].is_null()
            || status["group"]["owners"]
                .as_array()
                .is_some_and(|o| o.iter().all(|o| o["owner"].is_null())),
        "everything is released after SIGTERM: {status}"
    );
    assert_never_doubly_owned(scratch);
}

/// At most two of four replicas run at once with `--slots 2`, each with
/// its slot and that slot's token; a finished command frees its slot for
/// the next.
#[test]
fn slots_run_at_most_k_commands_at_once() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    // Each command runs a moment, then exits: the next waiter takes its slot.
    let brief = r#"K="$LEASEHOLD_SLOT"
exec 9>"lock-$K"
flock -n 9 || echo "double $K $LEASEHOLD_TOKEN $LEASEHOLD_ID" >> moves.log
echo "start $K $LEASEHOLD_TOKEN $LEASEHOLD_ID $LEASEHOLD_SLOTS $LEASEHOLD_ELECTION" >> moves.log
sleep 1 9>&-
echo "stop $K $LEASEHOLD_TOKEN $LEASEHOLD_ID" >> moves.log"#;
    let replicas: Vec<Proc> = ["w", "x", "y", "z"]
        .iter()
        .map(|id| {
            Proc::spawn(
                leasehold()
                    .args(["run", "--election", GROUP, "--slots", "2", "--id", id])
                    .args(["--store", &store])
                    .args(["--", "sh", "-c", brief])
                    .current_dir(scratch.dir.path())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
            )
        })
        .collect();
    for mut replica in replicas {
        let status = replica.wait_for_exit(60 * SECOND);
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "run exits with its command's status"
        );
    }
    let log = read_lines(&scratch.path("moves.log"));
    assert_eq!(
        log.iter().filter(|l| l.starts_with("start ")).count(),
        4,
        "{log:?}"
    );
    let mut at_once = 0;
    let mut most = 0;
    for line in &log {
        if line.starts_with("start ") {
            at_once += 1;
            most = most.max(at_once);
            let k = line.split(' ').nth(1).expect("slot");
            assert!(k == "0" || k == "1", "{line}");
            assert!(line.ends_with(&format!(" 2 jobs/slot/{k}")), "{line}");
        } else if line.starts_with("stop ") {
            at_once -= 1;
        }
    }
    assert!(most <= 2, "more than two commands ran at once: {log:?}");
    assert_eq!(most, 2, "two slots were never used at once: {log:?}");
    assert_never_doubly_owned(&scratch);
}

/// Bad input: one line, exit 2, nothing written; a count that differs
/// from the group's: one line naming the count in use, exit 1.
/// A single election's `run` and a group's member started at the same
/// moment on one name: one of them is refused, never both run (before,
/// both checked for the other before either wrote, and in half the rounds
/// or more a plain command ran beside the group's).
#[test]
fn a_plain_run_and_a_group_started_at_once_never_both_run() {
    for round in 0..6 {
        let scratch = Scratch::new();
        let store = scratch.store_url();
        let _group = member(&store, &scratch, "x", &["--shards", "2"]);
        let _plain = member(&store, &scratch, "w", &[]);
        let started = |id: &str| {
            read_lines(&scratch.path("moves.log"))
                .iter()
                .any(|line| line.starts_with("start ") && line.split(' ').nth(3) == Some(id))
        };
        assert!(
            wait_until(10 * SECOND, || started("x") || started("w")),
            "round {round}: nothing ran"
        );
        // Time for the other to start too, were it not refused.
        std::thread::sleep(SECOND);
        assert!(
            !(started("x") && started("w")),
            "round {round}: a plain run and a group ran under one name: {:?}",
            read_lines(&scratch.path("moves.log"))
        );
    }
}

/// A plain `run` that leads one of a group's shard names, started before
/// the group had members, is no member's, though its id is a member's:
/// the member owns and runs only the other shard, and `status` counts it so
/// (before, it counted the plain run's shard as the member's). Meanwhile
/// another plain `run` on a shard's name is refused.
#[test]
fn a_plain_run_that_took_a_shard_s_name_first_is_no_member_s() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let _plain = Proc::spawn(
        leasehold()
            .args(["run", "-e", "jobs/shard/1", "--id", "a", "--store", &store])
            .args(["--", "sh", "-c", "echo started >> plain.log; exec sleep 60"])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    assert!(wait_until(10 * SECOND, || !read_lines(
        &scratch.path("plain.log")
    )
    .is_empty()));
    let _a = member(&store, &scratch, "a", &["--shards", "2"]);
    let started = || {
        read_lines(&scratch.path("moves.log"))
            .iter()
            .filter(|l| l.starts_with("start "))
            .map(|l| l.split(' ').nth(1).unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
    };
    assert!(
        wait_until(10 * SECOND, || started() == ["0"]),
        "{:?}",
        started()
    );
    assert!(wait_until(10 * SECOND, || loads(&store, &["a"]) == (vec![1], 2)));
    let status = status_json_once_created(&store, GROUP);
    let members: Vec<bool> = status["group"]["owners"]
        .as_array()
        .map(|o| o.iter().map(|o| o["member"] == true).collect())
        .unwrap_or_default();
    assert_eq!(members, [true, false], "{status}");
    let text = leasehold()
        .args(["status", "-e", GROUP, "--store", &store])
        .output()
        .expect("spawn");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("1 of 2 owned"), "{text}");
    assert!(
        text.contains("shard 1: a (token 1), not as a member"),
        "{text}"
    );
    let out = leasehold()
        .args(["run", "-e", "jobs/shard/0", "--store", &store, "--id", "b"])
        .args(["--", "true"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("belongs to the group jobs"),
        "{}",
        stderr(&out)
    );
    assert_eq!(started(), ["0"], "the member took the plain run's shard");
}

#[test]
fn group_flags_are_checked() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    for args in [
        &["--shards", "0"][..],
        &["--slots", "0"],
        &["--shards", "2", "--slots", "2"],
        &["--shards", "65537"],
        &["--shards", "2", "--priority", "1"],
        &["--slots", "2", "--lock-delay", "1s"],
        &["--restart-delay", "2s"],
        &["--slots", "2", "--restart-delay", "2s"],
    ] {
        let out = leasehold()
            .args(["run", "--election", GROUP, "--store", &store])
            .args(args)
            .args(["--", "true"])
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_eq!(
            stderr(&out).lines().count(),
            1,
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(
            !scratch.path("leasehold.db").exists(),
            "{args:?} wrote a store"
        );
    }
    let _a = member(&store, &scratch, "a", &["--shards", "3"]);
    assert!(wait_until(10 * SECOND, || loads(&store, &["a"]) == (vec![3], 3)));
    for (args, said) in [
        (&["--shards", "4"][..], "3 shards"),
        (&["--slots", "3"], "3 shards"),
        (&[], "--shards 3"),
    ] {
        let out = leasehold()
            .args(["run", "--election", GROUP, "--store", &store, "--id", "b"])
            .args(args)
            .args(["--", "true"])
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let last = stderr(&out).lines().last().unwrap_or_default().to_owned();
        assert!(last.contains(said), "{args:?}: {}", stderr(&out));
        // A member's flag: it says what it could not join, as the other
        // flag's does.
        if !args.is_empty() {
            assert!(last.contains(": cannot "), "{args:?}: {last}");
        }
    }
    // A group's shard elections are its members' alone.
    for args in [
        &["-e", "jobs/shard/0"][..],
        &["-e", "jobs/shard/1", "--shards", "2"],
        &["-e", "jobs/slot/queue"],
    ] {
        let out = leasehold()
            .args(["run", "--store", &store, "--id", "b"])
            .args(args)
            .args(["--", "true"])
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("belongs to the group jobs"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // `campaign` too: neither the group's name nor one of its shards.
    for name in [GROUP, "jobs/shard/2"] {
        let out = leasehold()
            .args(["campaign", "-e", name, "--store", &store, "--id", "b"])
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains("group"), "{name}: {}", stderr(&out));
    }
    assert_eq!(
        loads(&store, &["a", "b"]),
        (vec![3, 0], 3),
        "a refused member changed the group"
    );
    let help = leasehold().args(["run", "--help"]).output().expect("spawn");
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--shards",
        "--slots",
        "--restart-delay",
        "LEASEHOLD_SHARD",
        "LEASEHOLD_SLOT",
    ] {
        assert!(help.contains(flag), "{flag} missing from run --help");
    }
}

/// `run --shards --http`: `/status` shows the group and this runner's
/// shards; `/metrics` counts them.
#[test]
fn a_shard_member_serves_its_view() {
    use super::operability::{free_addr, get, sample};
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let addr = free_addr();
    let _a = member(
        &store,
        &scratch,
        "a",
        &["--shards", "3", "--http", &addr.to_string()],
    );
    assert!(
        wait_until(20 * SECOND, || get(addr, "/metrics")
            .and_then(|(_, m)| sample(&m, "leasehold_shards_owned"))
            == Some(3.0)),
        "the runner never reported owning its 3 shards"
    );
    let (code, body) = get(addr, "/status").expect("status");
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(status["mine"], serde_json::json!([0, 1, 2]), "{status}");
    assert_eq!(status["group"]["kind"], "shards", "{status}");
    assert_eq!(status["group"]["members"][0]["owns"], 3, "{status}");
    assert_eq!(status["is_leader"], true, "{status}");
    let (_, metrics) = get(addr, "/metrics").expect("metrics");
    assert_eq!(
        sample(&metrics, "leasehold_shards_gained_total"),
        Some(3.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "leasehold_group_members"),
        Some(1.0),
        "{metrics}"
    );
}

/// `observe` on a group's name prints the group again whenever a member
/// joins or leaves or a shard changes owner: its members, how many shards
/// each owns, and each shard's owner with its token.
#[test]
fn observe_follows_a_groups_members_and_owners() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let a = member(&store, &scratch, "a", &["--shards", "2"]);
    assert!(
        wait_until(20 * SECOND, || loads(&store, &["a"]) == (vec![2], 2)),
        "a never took both shards"
    );
    let mut observer = Proc::spawn(
        leasehold()
            .args(["observe", "--election", GROUP, "--store", &store])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let stdout = observer.child.stdout.take().expect("stdout");
    let (lines_tx, lines) = std::sync::mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let value = serde_json::from_str(&line).expect("observe prints JSON lines");
            if lines_tx.send(value).is_err() {
                return;
            }
        }
    });
    // Each member's count of shards, as one line of `observe` says.
    let owns = |line: &serde_json::Value| -> Vec<(String, u64)> {
        line["group"]["members"]
            .as_array()
            .map(|members| {
                members
                    .iter()
                    .map(|m| {
                        (
                            m["id"].as_str().unwrap_or("?").to_owned(),
                            m["owns"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let until = |want: &[(&str, u64)]| -> serde_json::Value {
        let deadline = std::time::Instant::now() + 30 * SECOND;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            let Ok(line) = lines.recv_timeout(left) else {
                break;
            };
            assert_eq!(line["election"], GROUP, "{line}");
            assert_eq!(line["group"]["kind"], "shards", "{line}");
            assert_eq!(line["group"]["count"], 2, "{line}");
            let got = owns(&line);
            if got
                .iter()
                .map(|(id, n)| (id.as_str(), *n))
                .eq(want.iter().copied())
            {
                return line;
            }
            seen.push(line);
        }
        panic!("observe never printed {want:?}; it printed {seen:?}");
    };
    let first = until(&[("a", 2)]);
    let owners = first["group"]["owners"].as_array().expect("owners");
    assert_eq!(owners.len(), 2, "{first}");
    for (k, owner) in owners.iter().enumerate() {
        assert_eq!(owner["index"], k, "{first}");
        assert_eq!(owner["election"], format!("{GROUP}/shard/{k}"), "{first}");
        assert_eq!(owner["owner"]["id"], "a", "{first}");
        assert!(owner["owner"]["token"].as_u64().is_some(), "{first}");
    }
    let b = member(&store, &scratch, "b", &["--shards", "2"]);
    until(&[("a", 1), ("b", 1)]);
    b.signal(nix::sys::signal::Signal::SIGTERM);
    until(&[("a", 2)]);
    observer.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        observer.wait_for_exit(10 * SECOND).and_then(|s| s.code()),
        Some(0)
    );
    drop(a);
}

/// A shard whose command keeps exiting at once backs off (from
/// `--restart-delay`, doubling, up to a minute), so a crash loop cannot
/// keep the runner too busy to renew its lease.
#[test]
fn a_crash_looping_shard_backs_off() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let mut runner = Proc::spawn(
        leasehold()
            .args([
                "run",
                "--election",
                GROUP,
                "--shards",
                "1",
                "--restart-delay",
                "0s",
            ])
            .args(["--store", &store])
            .args(["--", "sh", "-c", "echo start >> moves.log"])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    std::thread::sleep(3 * SECOND);
    runner.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        runner.wait_for_exit(10 * SECOND).and_then(|s| s.code()),
        Some(0)
    );
    let starts = read_lines(&scratch.path("moves.log")).len();
    // 0 s, 0.1 s, 0.2 s, 0.4 s, 0.8 s, 1.6 s: at most 6 or 7 in 3 s
    // (without the back-off, hundreds).
    assert!((2..=10).contains(&starts), "{starts} starts in 3 s");
}

/// The command of a nested `run`: writes its environment to
/// `ELECTION.env` (an election of the inner `run`'s own), then waits.
const DUMP_ENV: &str = r#"env > "$LEASEHOLD_ELECTION.tmp" && mv "$LEASEHOLD_ELECTION.tmp" "$LEASEHOLD_ELECTION.env"
exec sleep 600"#;

/// A plain `run` of election `inner-K` nested in a `run` with `group`
/// (`--shards N` or `--slots N`), K being the outer shard or slot; the
/// environments its commands saw, once `commands` of them have written
/// theirs, by file name.
/// The inner commands' environments by file name, and the outer terms'
/// tokens by `inner-N.outer`.
type NestedEnvs = (Vec<(String, Vec<String>)>, HashMap<String, u64>);

fn nested_run_envs(group: &[&str], commands: usize) -> NestedEnvs {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    let outer = r#"echo "$LEASEHOLD_TOKEN" > "inner-${LEASEHOLD_SHARD:-$LEASEHOLD_SLOT}.outer"
exec "$0" run --election "inner-${LEASEHOLD_SHARD:-$LEASEHOLD_SLOT}" --ttl 30s --store "$1" -- sh -c "$2""#;
    let mut runner = Proc::spawn(
        leasehold()
            .args(["run", "--election", "outer", "--ttl", "30s", "--id", "m"])
            .args(["--store", &store])
            .args(group)
            .args(["--", "sh", "-c", outer, env!("CARGO_BIN_EXE_leasehold")])
            .args([store.as_str(), DUMP_ENV])
            .current_dir(scratch.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let written = || {
        let mut names: Vec<String> = std::fs::read_dir(scratch.dir.path())
            .expect("scratch")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| name.ends_with(".env"))
            .collect();
        names.sort();
        names
    };
    assert!(
        wait_until(30 * SECOND, || written().len() == commands),
        "{:?}",
        written()
    );
    runner.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(runner.wait_for_exit(30 * SECOND).is_some());
    let envs = written()
        .into_iter()
        .map(|name| {
            let env = read_lines(&scratch.path(&name));
            (name, env)
        })
        .collect();
    let outers = std::fs::read_dir(scratch.dir.path())
        .expect("scratch")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let token = read_lines(&scratch.path(&name)).first()?.parse().ok()?;
            name.ends_with(".outer").then_some((name, token))
        })
        .collect();
    (envs, outers)
}

/// A command's LEASEHOLD_* describe its own term only: a plain `run`
/// nested in `run --shards` or `run --slots` gives its command its own
/// election, id (its own default, not the outer's `m`) and token, and not
/// the outer shard or slot variables.
#[test]
fn a_nested_run_gives_its_command_only_its_own_term() {
    for (group, expected) in [
        (&["--shards", "2"], &["inner-0.env", "inner-1.env"][..]),
        (&["--slots", "1"], &["inner-0.env"][..]),
    ] {
        let (envs, outers) = nested_run_envs(group, expected.len());
        let names: Vec<&str> = envs.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, expected, "{group:?}");
        for (name, env) in &envs {
            let ours: Vec<&String> = env.iter().filter(|l| l.starts_with("LEASEHOLD_")).collect();
            let election = name.trim_end_matches(".env");
            let wanted = format!("LEASEHOLD_ELECTION={election}");
            assert!(
                ours.contains(&&wanted),
                "{group:?}: {wanted} missing: {ours:?}"
            );
            // Its own term's token: granted after the outer term's, so
            // higher (the store's revisions are shared by every election).
            let tokens: Vec<u64> = ours
                .iter()
                .filter_map(|l| l.strip_prefix("LEASEHOLD_TOKEN=")?.parse().ok())
                .collect();
            let outer = &outers[&format!("{election}.outer")];
            assert!(
                tokens.len() == 1 && tokens[0] > *outer,
                "{group:?}: not its own term's token (the outer's was {outer}): {ours:?}"
            );
            let id = ours
                .iter()
                .find_map(|l| l.strip_prefix("LEASEHOLD_ID="))
                .unwrap_or_else(|| panic!("{group:?}: no LEASEHOLD_ID: {ours:?}"));
            assert_ne!(id, "m", "{group:?}: the outer term's id");
            assert!(
                id.contains('-')
                    && id
                        .rsplit('-')
                        .next()
                        .is_some_and(|pid| pid.parse::<u32>().is_ok()),
                "{group:?}: not a default id (<hostname>-<pid>): {id}"
            );
            for outer in ["SHARD", "SHARDS", "SLOT", "SLOTS"] {
                let outer = format!("LEASEHOLD_{outer}=");
                assert!(
                    !ours.iter().any(|l| l.starts_with(&outer)),
                    "{group:?}: the outer term's {outer}: {ours:?}"
                );
            }
        }
    }
}

/// A `run` or `campaign` started by another `run`'s command without an
/// election of its own: the LEASEHOLD_ELECTION it inherited names the
/// outer run's election, so it is refused (exit 2, one line saying to give
/// --election) instead of waiting, under the outer's id, for itself.
#[test]
fn a_nested_run_without_an_election_of_its_own_is_refused() {
    let scratch = Scratch::new();
    let store = scratch.store_url();
    // Under `timeout`: before, the inner `run` waited for itself forever.
    let inner = r#"timeout 10 "$0" run --store "$1" -- true 2> run.err; echo "run $?" >> codes
timeout 10 "$0" campaign --store "$1" 2> campaign.err; echo "campaign $?" >> codes"#;
    let out = leasehold()
        .args(["run", "--election", "outer", "--id", "m", "--store", &store])
        .args([
            "--",
            "sh",
            "-c",
            inner,
            env!("CARGO_BIN_EXE_leasehold"),
            &store,
        ])
        .current_dir(scratch.dir.path())
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read_lines(&scratch.path("codes")), ["run 2", "campaign 2"]);
    for name in ["run.err", "campaign.err"] {
        let err = std::fs::read_to_string(scratch.path(name)).expect("stderr");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(err.contains("give this one --election"), "{name}: {err}");
    }
}
