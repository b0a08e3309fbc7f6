//! `palisade completions SHELL`: each script is one the shell parses, and names the commands.

use std::io::Write as _;
use std::process::{Command, Stdio};

fn completions(shell: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["completions", shell])
        .output()
        .expect("run palisade completions")
}

/// Runs `shell args` with `script` on stdin (or as a file when `as_file`); `None` when the shell
/// is not installed.
fn syntax_check(shell: &str, args: &[&str], script: &[u8]) -> Option<std::process::Output> {
    let mut child = match Command::new(shell)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => panic!("cannot run {shell}: {error}"),
    };
    child.stdin.take().unwrap().write_all(script).unwrap();
    Some(child.wait_with_output().unwrap())
}

#[test]
fn each_completion_script_parses_in_its_shell_and_names_the_commands() {
    for (shell, check) in [
        ("bash", &["-n"][..]),
        ("zsh", &["-n"][..]),
        ("fish", &["--no-execute"][..]),
    ] {
        let output = completions(shell);
        assert!(output.status.success(), "{shell}: {output:?}");
        let script = String::from_utf8(output.stdout).unwrap();
        for command in [
            "serve",
            "lock",
            "acquire",
            "status",
            "store",
            "cluster",
            "completions",
        ] {
            assert!(script.contains(command), "{shell} script lacks {command}");
        }
        match syntax_check(shell, check, script.as_bytes()) {
            Some(checked) => assert!(
                checked.status.success(),
                "{shell} refuses its completion script: {}",
                String::from_utf8_lossy(&checked.stderr)
            ),
            None => eprintln!("skipping: {shell} is not installed, its script is not parsed"),
        }
    }
}

#[test]
fn an_unknown_shell_is_a_usage_error_naming_the_shells() {
    let output = completions("tcsh");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bash") && stderr.contains("zsh") && stderr.contains("fish"),
        "{stderr}"
    );
}
