//! `LEASEHOLD_STORE_PASSWORD` in a program that uses the library: the
//! library's own messages tell users to set it, so `store::open` takes it
//! as the command line does — the password of a URL that names only the
//! user, and refused beside a password in the URL or for a store that
//! takes none.
//!
//! The variable is set in a child process only (this test binary, started
//! again with [`CHILD_URL`] set, runs [`open_in_child`] only): set in this
//! process, it would reach every other test that opens a store.

use std::process::{Command, Output};
use std::time::Duration;

use leasehold::store::StoreUrl;
use leasehold_testkit::ZooKeeperServer;

/// The URL the child process opens; its presence makes [`open_in_child`]
/// one.
const CHILD_URL: &str = "LEASEHOLD_TEST_PASSWORD_ENV_URL";
/// What the child prints once the store is open and it holds an election.
const HELD: &str = "password-env-child-held";
const PASSWORD: &str = "Env-Pa55word";

/// Not a test on its own (it returns at once): the child process the
/// tests below start. It opens the store at [`CHILD_URL`] with
/// `leasehold::store::open`, campaigns for an election and prints the
/// token, or prints why it could not.
#[test]
fn open_in_child() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let url: StoreUrl = url.parse().expect("a valid URL");
        let store = match leasehold::store::open(&url, leasehold::store::Access::ReadWrite).await {
            Ok(store) => store,
            Err(error) => {
                println!("refused: {error}");
                return;
            }
        };
        let election = leasehold::testing::unique_election("env");
        let grant = leasehold::testing::campaign_on_new_session(
            &*store,
            &election,
            "child",
            Duration::from_secs(10),
        )
        .await;
        println!("{HELD} {}", grant.token);
    });
}

/// Runs [`open_in_child`] on `url` with `LEASEHOLD_STORE_PASSWORD` set to
/// `password` (or unset): what it printed, which never holds a password.
fn open_with_env(url: &str, password: Option<&str>) -> String {
    let mut child = Command::new(std::env::current_exe().expect("test binary"));
    child
        .args([
            "--exact",
            "suite::password_env::open_in_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_URL, url);
    match password {
        Some(password) => child.env("LEASEHOLD_STORE_PASSWORD", password),
        None => child.env_remove("LEASEHOLD_STORE_PASSWORD"),
    };
    let Output { status, stdout, .. } = child.output().expect("start the child");
    assert!(status.success(), "the child failed: {status:?}");
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    for secret in [PASSWORD, "Wr0ngPass", "Sup3rSecret"] {
        assert!(!stdout.contains(secret), "the password shows: {stdout}");
    }
    stdout
}

/// A ZooKeeper URL that names only the user opens with the password from
/// the environment (and campaigns: the nodes are the user's alone, so
/// only the right password gets that far); a wrong one is denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_takes_the_password_from_the_environment() {
    let server = tokio::task::spawn_blocking(ZooKeeperServer::start)
        .await
        .expect("server start");
    let root = "/from-env";
    // The first use, with the password in the URL, makes the root the
    // user's alone.
    let url: StoreUrl = server
        .url_as("app", PASSWORD, root)
        .parse()
        .expect("a valid URL");
    leasehold::store::open(&url, leasehold::store::Access::ReadWrite)
        .await
        .expect("first use with credentials");
    let user_only = server.url(root).replace("zk://", "zk://app@");

    let shown = open_with_env(&user_only, Some(PASSWORD));
    assert!(shown.contains(HELD), "{shown}");

    let shown = open_with_env(&user_only, Some("Wr0ngPass"));
    assert!(
        shown.contains("refused: ") && shown.contains("wrong password"),
        "{shown}"
    );

    // Without it, the user has no password: the message says where to
    // give one.
    let shown = open_with_env(&user_only, None);
    assert!(
        shown.contains("refused: ") && shown.contains("LEASEHOLD_STORE_PASSWORD"),
        "{shown}"
    );
}

/// Refused as on the command line, before anything is opened: a password
/// given twice, a store that takes none, an empty variable.
#[test]
fn open_refuses_the_environments_password_where_the_command_line_does() {
    let cases = [
        (
            "zk://app:Sup3rSecret@127.0.0.1:1/p",
            PASSWORD,
            "a password is given twice",
        ),
        (
            "etcd://127.0.0.1:1/p",
            PASSWORD,
            "the store URL names no user",
        ),
        ("memory:", PASSWORD, "stores take no password"),
        ("etcd://app@127.0.0.1:1/p", "", "is empty"),
    ];
    for (url, password, needle) in cases {
        let shown = open_with_env(url, Some(password));
        assert!(
            shown.contains("refused: ") && shown.contains(needle),
            "{url}: {shown}"
        );
    }
}
