//! `leasehold completions SHELL` and `leasehold man` (issue 12: installing
//! leasehold should give shell completions and a manual page).

use std::process::{Command, Stdio};

use super::harness::{Scratch, leasehold, stderr};

/// The subcommands `leasehold --help` lists (without `help` itself).
fn subcommands() -> Vec<String> {
    let out = leasehold().arg("--help").output().expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let names: Vec<String> = text
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 8, "{text}");
    names
}

#[test]
fn bash_completions_are_valid_bash_and_complete_every_subcommand() {
    let out = leasehold()
        .args(["completions", "bash"])
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    let scratch = Scratch::new();
    let script = scratch.path("leasehold.bash");
    std::fs::write(&script, &out.stdout).expect("write");
    let check = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .expect("spawn bash");
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("complete -F"), "{text}");
    for sub in subcommands() {
        assert!(text.contains(&sub), "{sub} is not completed");
    }
    assert!(text.contains("--election"), "{text}");
}

#[test]
fn completions_for_every_shell_and_none_for_an_unknown_one() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = leasehold()
            .args(["completions", shell])
            .output()
            .expect("spawn");
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("leasehold"), "{shell}: {text}");
        assert!(text.contains("tune"), "{shell}: {text}");
        // run's internal guard is no subcommand to offer.
        assert!(!text.contains("__guard"), "{shell}: {text}");
    }
    let out = leasehold()
        .args(["completions", "tcsh"])
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
}

#[test]
fn the_man_page_names_every_subcommand() {
    let out = leasehold().arg("man").output().expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    let page = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(page.contains(".TH leasehold 1"), "{page}");
    assert!(page.contains(".SH SUBCOMMANDS"), "{page}");
    for sub in subcommands() {
        // roff escapes the hyphen: leasehold\-run(1).
        let reference = format!("leasehold\\-{sub}(1)");
        assert!(page.contains(&reference), "{reference} missing: {page}");
    }
    assert!(
        !page.contains("__guard"),
        "a hidden subcommand is documented"
    );

    // --dir writes the page and one per subcommand, with its options.
    let scratch = Scratch::new();
    let dir = scratch.path("man1");
    let out = leasehold()
        .args(["man", "--dir"])
        .arg(&dir)
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(dir.join("leasehold.1")).expect("leasehold.1"),
        page
    );
    for sub in subcommands() {
        let path = dir.join(format!("leasehold-{sub}.1"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(text.contains(".SH OPTIONS"), "{sub}: {text}");
    }
    let run = std::fs::read_to_string(dir.join("leasehold-run.1")).expect("run page");
    assert!(run.contains("renew\\-every"), "{run}");
    assert!(!dir.join("leasehold-__guard.1").exists());
}
