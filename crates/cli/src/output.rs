//! Formatting shared by the commands: shell-safe `KEY=value` lines, durations, tables, JSON.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::Duration;

use palisade_client::{Access, Holder, LockStatus, SessionId};
use serde_json::{Value, json};

/// `value` quoted for a POSIX shell, unless it needs no quoting.
pub fn shell_quote(value: &str) -> Cow<'_, str> {
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:@%+,=".contains(&b));
    if plain {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(format!("'{}'", value.replace('\'', r"'\''")))
    }
}

/// `KEY=value` lines a shell can `eval`.
pub fn shell_assignments(pairs: &[(&str, String)]) -> String {
    let mut text = String::new();
    for (key, value) in pairs {
        let _ = writeln!(text, "{key}={}", shell_quote(value));
    }
    text
}

/// `450ms`, `8.2s`, `2m05s`, `3h07m`.
pub fn human_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => {
            let tenths = (ms + 50) / 100;
            if tenths.is_multiple_of(10) {
                format!("{}s", tenths / 10)
            } else {
                format!("{}.{}s", tenths / 10, tenths % 10)
            }
        }
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1_000),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms % 3_600_000) / 60_000),
    }
}

/// Milliseconds as a JSON number.
fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The JSON form of a lock's state, as `status --json` and `locks --json` print it.
pub fn status_json(status: &LockStatus) -> Value {
    let holder = |h: &Holder| {
        json!({
            "session": h.session,
            "token": h.token,
            "lease_remaining_ms": ms(h.lease_remaining),
            "value": h.value,
            "access": access_name(h.access),
            "slot": h.access.slot(),
        })
    };
    json!({
        "lock": status.lock,
        "holder": status.holder.as_ref().map(holder),
        "sharers": status.sharers.iter().map(holder).collect::<Vec<_>>(),
        "permits": status.permits,
        "last_token": status.last_token,
        "waiters": status.waiters,
        "lock_delay_remaining_ms": status.lock_delay_remaining.map(ms),
    })
}

/// `exclusive`, `shared` or `slot`: how a grant holds its lock, in JSON.
fn access_name(access: Access) -> &'static str {
    match access {
        Access::Exclusive => "exclusive",
        Access::Shared => "shared",
        Access::Slot(_) => "slot",
    }
}

/// One reader or permit holder, on one line: `session 7, token 42 (slot 1), lease 9.5s`.
fn sharer_text(h: &Holder) -> String {
    let place = match h.access {
        Access::Slot(slot) => format!(" (slot {slot})"),
        _ => String::new(),
    };
    let value = h
        .value
        .as_deref()
        .map_or(String::new(), |v| format!(", value {v}"));
    format!(
        "session {}, token {}{place}, lease {}{value}",
        h.session,
        h.token,
        human_duration(h.lease_remaining)
    )
}

/// The human form of one lock's state: aligned `field value` lines.
pub fn status_text(status: &LockStatus) -> String {
    let mut rows: Vec<(&str, String)> = vec![("lock", status.lock.clone())];
    if let Some(permits) = status.permits {
        let free = permits as usize - status.sharers.len().min(permits as usize);
        rows.push(("semaphore", format!("{permits} permits, {free} free")));
    }
    let label = if status.permits.is_some() {
        "permit"
    } else {
        "reader"
    };
    for sharer in &status.sharers {
        rows.push((label, sharer_text(sharer)));
    }
    match &status.holder {
        _ if !status.sharers.is_empty() => {}
        Some(holder) => {
            rows.push(("holder", format!("session {}", holder.session)));
            rows.push(("token", holder.token.to_string()));
            rows.push((
                "lease",
                format!("{} remaining", human_duration(holder.lease_remaining)),
            ));
            if let Some(value) = &holder.value {
                rows.push(("value", value.clone()));
            }
        }
        None if status.permits.is_some() => {}
        None => rows.push(("holder", "none (free)".to_string())),
    }
    rows.push(("last token", status.last_token.to_string()));
    let waiters = match status.waiters.as_slice() {
        [] => "0".to_string(),
        sessions => format!(
            "{} (sessions {})",
            sessions.len(),
            sessions
                .iter()
                .map(SessionId::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    rows.push(("waiters", waiters));
    if let Some(delay) = status.lock_delay_remaining {
        rows.push(("lock-delay", format!("{} remaining", human_duration(delay))));
    }
    let mut text = String::new();
    for (field, value) in rows {
        let _ = writeln!(text, "{field:<12} {value}");
    }
    text
}

/// Longest value a table cell shows, in characters; `status` and `--json` show it whole.
const VALUE_CELL_CHARS_MAX: usize = 40;

/// `value` cut to [`VALUE_CELL_CHARS_MAX`] characters, with `…` where it was cut.
fn value_cell(value: &str) -> String {
    if value.chars().count() <= VALUE_CELL_CHARS_MAX {
        return value.to_string();
    }
    let kept: String = value.chars().take(VALUE_CELL_CHARS_MAX - 1).collect();
    format!("{kept}…")
}

/// A table of locks for humans.
pub fn locks_table(locks: &[LockStatus]) -> String {
    let header = [
        "LOCK",
        "HOLDER",
        "TOKEN",
        "LAST TOKEN",
        "WAITERS",
        "LEASE",
        "VALUE",
    ]
    .map(String::from);
    let mut rows = vec![header];
    for status in locks {
        let (holder, token, lease, value) = match (&status.holder, status.sharers.as_slice()) {
            (Some(h), _) => (
                h.session.to_string(),
                h.token.to_string(),
                human_duration(h.lease_remaining),
                h.value.as_deref().map_or("-".to_string(), value_cell),
            ),
            (None, []) => ("-".into(), "-".into(), "-".into(), "-".into()),
            // Readers share one token; permits each have their own: the table names the count.
            (None, sharers) => {
                let what = match status.permits {
                    Some(permits) => format!("{}/{permits} permits", sharers.len()),
                    None => format!("{} readers", sharers.len()),
                };
                let token = match status.permits {
                    Some(_) => "-".to_string(),
                    None => sharers[0].token.to_string(),
                };
                (what, token, "-".into(), "-".into())
            }
        };
        rows.push([
            status.lock.clone(),
            holder,
            token,
            status.last_token.to_string(),
            status.waiters.len().to_string(),
            lease,
            value,
        ]);
    }
    let mut widths = [0usize; 7];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_values_that_need_quotes_get_them() {
        assert_eq!(shell_quote("jobs/nightly"), "jobs/nightly");
        assert_eq!(
            shell_quote("pal2.fe812c12f3ab4ce6.am9icw.42.7.sig-_"),
            "pal2.fe812c12f3ab4ce6.am9icw.42.7.sig-_"
        );
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("$(rm -rf /)"), "'$(rm -rf /)'");
        assert_eq!(shell_quote("~root"), "'~root'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn assignments_are_one_per_line() {
        let text = shell_assignments(&[
            ("PALISADE_LOCK", "a b".to_string()),
            ("PALISADE_TOKEN", "3".to_string()),
        ]);
        assert_eq!(text, "PALISADE_LOCK='a b'\nPALISADE_TOKEN=3\n");
    }

    #[test]
    fn a_long_value_is_cut_in_a_table_cell() {
        assert_eq!(value_cell("10.0.0.1:5432"), "10.0.0.1:5432");
        let long = "é".repeat(100);
        let cell = value_cell(&long);
        assert_eq!(cell.chars().count(), VALUE_CELL_CHARS_MAX);
        assert!(cell.ends_with('…'));
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_duration(Duration::from_millis(450)), "450ms");
        assert_eq!(human_duration(Duration::from_millis(8_240)), "8.2s");
        assert_eq!(human_duration(Duration::from_secs(10)), "10s");
        assert_eq!(human_duration(Duration::from_secs(125)), "2m05s");
        assert_eq!(human_duration(Duration::from_secs(3 * 3600 + 420)), "3h07m");
    }
}
