//! Scenarios for `palisade store put|get|delete|fence` as a shell script sees them: what is
//! printed, and the exit status.

use clap::{CommandFactory as _, Parser};
use palisade_cli::store::{
    EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_STALE, EXIT_UNAVAILABLE, StoreCommand, execute,
};
use palisade_testkit::{ServiceKey, StoreServer, impostor_grant};

/// The `palisade store` part of the command line, as the `palisade` binary nests it.
#[derive(Debug, Parser)]
#[command(name = "palisade-store")]
struct StoreCli {
    #[command(subcommand)]
    command: StoreCommand,
}

struct Outcome {
    status: u8,
    stdout: String,
    stderr: String,
}

async fn palisade_store(args: &[&str]) -> Outcome {
    let cli =
        StoreCli::try_parse_from(std::iter::once("palisade-store").chain(args.iter().copied()))
            .unwrap_or_else(|error| panic!("{args:?}: {error}"));
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let status = execute(cli.command, &mut stdout, &mut stderr).await;
    Outcome {
        status,
        stdout: String::from_utf8(stdout).unwrap(),
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

#[tokio::test]
async fn a_script_writes_under_its_lock_and_a_superseded_one_exits_3_naming_the_accepted_token() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let url = server.url.as_str();
    let current = service.grant("jobs/nightly", 9, 4);
    let superseded = service.grant("jobs/nightly", 7, 3);

    // Phase: the current holder writes (as `palisade lock jobs/nightly -- palisade store put …`).
    let put = palisade_store(&[
        "put",
        "report",
        "Tue Dec 2",
        "--sequencer",
        &current,
        "--store",
        url,
    ])
    .await;
    assert_eq!((put.status, put.stderr.as_str()), (0, ""));
    assert_eq!(
        put.stdout,
        "stored \"report\" (lock \"jobs/nightly\", token 9, revision 1)\n"
    );

    // Phase: the superseded holder's write is refused with status 3.
    let stale = palisade_store(&[
        "put",
        "report",
        "old",
        "--sequencer",
        &superseded,
        "--store",
        url,
    ])
    .await;
    assert_eq!(stale.status, EXIT_STALE);
    assert!(
        stale.stderr.starts_with(
            "palisade: refused: token 7 for lock \"jobs/nightly\" is stale; the store has accepted token 9 (presented by session 4)"
        ),
        "{}",
        stale.stderr
    );
    assert_eq!(stale.stdout, "");

    // Phase: the value is the current holder's.
    let get = palisade_store(&["get", "report", "--store", url]).await;
    assert_eq!((get.status, get.stdout.as_str()), (0, "Tue Dec 2\n"));
    let json = palisade_store(&["get", "report", "--json", "--store", url]).await;
    let entry: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!((&entry["token"], &entry["session"]), (&9.into(), &4.into()));

    let fence = palisade_store(&["fence", "jobs/nightly", "--store", url]).await;
    assert_eq!(
        fence.stdout,
        "lock \"jobs/nightly\": accepted token 9 (presented by session 4)\n"
    );
}

#[tokio::test]
async fn a_token_issued_twice_exits_1_refused_naming_both_sessions_and_the_first_writes_on() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let url = server.url.as_str();
    let first = service.grant("jobs/nightly", 9, 4);
    // What a lock service restored from a backup hands out again: token 9, another session.
    let second = service.grant("jobs/nightly", 9, 5);
    let put = |sequencer: String, value: &'static str| async move {
        palisade_store(&[
            "put",
            "report",
            value,
            "--sequencer",
            &sequencer,
            "--store",
            url,
        ])
        .await
    };
    assert_eq!(put(first.clone(), "by 4").await.status, 0);

    for refused in [
        put(second.clone(), "by 5").await,
        palisade_store(&[
            "claim",
            "jobs/nightly",
            "--sequencer",
            &second,
            "--store",
            url,
        ])
        .await,
        palisade_store(&["get", "report", "--sequencer", &second, "--store", url]).await,
    ] {
        assert_eq!(refused.status, EXIT_REFUSED, "{}", refused.stderr);
        assert!(
            refused.stderr.starts_with(
                "palisade: refused: token 9 of lock \"jobs/nightly\" was first presented to the store by session 4, and session 5 presents it now: the lock service issued this token twice"
            ),
            "{}",
            refused.stderr
        );
        assert_eq!(refused.stdout, "");
    }
    assert_eq!(put(first, "again by 4").await.status, 0);
    let get = palisade_store(&["get", "report", "--store", url]).await;
    assert_eq!((get.status, get.stdout.as_str()), (0, "again by 4\n"));
}

#[tokio::test]
async fn missing_forged_and_foreign_sequencers_exit_4_with_distinct_messages() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let url = server.url.as_str();
    let owner = service.grant("jobs/nightly", 1, 1);
    assert_eq!(
        palisade_store(&["put", "report", "v", "--sequencer", &owner, "--store", url])
            .await
            .status,
        0
    );

    let missing = palisade_store(&["put", "report", "v", "--store", url]).await;
    assert_eq!(missing.status, EXIT_REFUSED);
    assert!(
        missing
            .stderr
            .starts_with("palisade: refused: no sequencer presented"),
        "{}",
        missing.stderr
    );

    let forged = impostor_grant("jobs/nightly", 1_000, 1);
    let forged =
        palisade_store(&["delete", "report", "--sequencer", &forged, "--store", url]).await;
    assert_eq!(forged.status, EXIT_REFUSED);
    assert!(
        forged
            .stderr
            .starts_with("palisade: refused: forged sequencer"),
        "{}",
        forged.stderr
    );

    let foreign = service.grant("jobs/other", 5, 2);
    let foreign = palisade_store(&[
        "put",
        "report",
        "v",
        "--sequencer",
        &foreign,
        "--store",
        url,
    ])
    .await;
    assert_eq!(foreign.status, EXIT_REFUSED);
    assert!(
        foreign
            .stderr
            .starts_with("palisade: refused: key \"report\" is protected by lock \"jobs/nightly\""),
        "{}",
        foreign.stderr
    );

    let garbage = palisade_store(&[
        "put",
        "report",
        "v",
        "--sequencer",
        "pal1.x",
        "--store",
        url,
    ])
    .await;
    assert_eq!(garbage.status, EXIT_REFUSED);
    assert!(
        garbage
            .stderr
            .starts_with("palisade: refused: malformed sequencer"),
        "{}",
        garbage.stderr
    );

    // With --json the refusal is also printed as the store's JSON, for scripts.
    let json = palisade_store(&["put", "report", "v", "--json", "--store", url]).await;
    let body: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(body["kind"], "missing");
}

#[tokio::test]
async fn get_of_an_absent_key_exits_5_and_an_oversized_key_is_refused_with_1() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let url = server.url.as_str();

    let absent = palisade_store(&["get", "nothing", "--store", url]).await;
    assert_eq!(absent.status, EXIT_NOT_FOUND);
    assert_eq!(absent.stderr, "palisade: key \"nothing\" not found\n");

    let holder = service.grant("jobs/nightly", 1, 1);
    let key = "k".repeat(2000);
    let oversized =
        palisade_store(&["put", &key, "v", "--sequencer", &holder, "--store", url]).await;
    assert_eq!(oversized.status, EXIT_REFUSED);
    assert!(
        oversized.stderr.contains("key_bytes_max is 1024"),
        "{}",
        oversized.stderr
    );

    // A value that starts with '-' is a value, not an option.
    let dash = palisade_store(&["put", "k", "-1", "--sequencer", &holder, "--store", url]).await;
    assert_eq!(dash.status, 0, "{}", dash.stderr);
    assert_eq!(
        palisade_store(&["get", "k", "--store", url]).await.stdout,
        "-1\n"
    );

    // A delete says whether there was something to delete.
    let deleted = palisade_store(&["delete", "k", "--sequencer", &holder, "--store", url]).await;
    assert_eq!(
        deleted.stdout,
        "deleted \"k\" (lock \"jobs/nightly\", token 1, revision 2)\n"
    );
    assert_eq!(
        palisade_store(&["get", "k", "--store", url]).await.status,
        EXIT_NOT_FOUND
    );
}

#[tokio::test]
async fn an_unreachable_store_exits_1_after_retrying() {
    let service = ServiceKey::new();
    let server = StoreServer::start(&service).await;
    let url = server.url.clone();
    server.stop().await;

    let holder = service.grant("jobs/nightly", 1, 1);
    let put = palisade_store(&["put", "k", "v", "--sequencer", &holder, "--store", &url]).await;
    assert_eq!(put.status, EXIT_UNAVAILABLE);
    assert!(
        put.stderr.starts_with("palisade: store unavailable:"),
        "{}",
        put.stderr
    );
    assert_eq!(
        palisade_store(&["get", "k", "--store", &url]).await.status,
        EXIT_UNAVAILABLE
    );
}

#[test]
fn the_sequencer_store_and_serve_options_come_from_the_documented_environment_variables() {
    let command = StoreCli::command();
    let env_of = |subcommand: &str, argument: &str| {
        command
            .find_subcommand(subcommand)
            .unwrap()
            .get_arguments()
            .find(|arg| arg.get_id() == argument)
            .and_then(|arg| arg.get_env())
            .map(|env| env.to_string_lossy().into_owned())
    };
    assert_eq!(
        env_of("put", "sequencer").as_deref(),
        Some("PALISADE_SEQUENCER")
    );
    assert_eq!(
        env_of("delete", "sequencer").as_deref(),
        Some("PALISADE_SEQUENCER")
    );
    assert_eq!(env_of("get", "store").as_deref(), Some("PALISADE_STORE"));
    assert_eq!(
        env_of("serve", "public_key").as_deref(),
        Some("PALISADE_PUBLIC_KEY")
    );
    assert_eq!(
        env_of("serve", "data_dir").as_deref(),
        Some("PALISADE_STORE_DATA_DIR")
    );
    assert_eq!(
        env_of("serve", "listen").as_deref(),
        Some("PALISADE_STORE_LISTEN")
    );

    // serve refuses a bad public key at parse time, with the key parser's message.
    let error =
        StoreCli::try_parse_from(["palisade-store", "serve", "--public-key", "nope"]).unwrap_err();
    assert!(error.to_string().contains("ed25519:"), "{error}");
}
