// The web UI of `palisade serve --ui-listen` (crates/server/src/ui/mod.rs has the protocol).
//
// It reads the live view `/api/stream` with a streamed fetch (EventSource cannot send a bearer
// token) and renders it. Every text that comes from the server, lock names above all, goes
// into the page through `textContent`, never as markup.
"use strict";

(() => {
  const TOKEN_KEY = "palisade-ui-token";
  // The server's TIMELINE_EVENTS_PER_LOCK_MAX and LOCK_NAME_BYTES_MAX.
  const TIMELINE_EVENTS_PER_LOCK_MAX = 16;
  const PREFIX_BYTES_MAX = 256;
  const RETRY_MS_MIN = 1000;
  const RETRY_MS_MAX = 10000;

  const $ = (id) => document.getElementById(id);

  // What the user asked to see.
  const view = { prefix: "", startAfter: null, controller: null, retryMs: RETRY_MS_MIN, retryTimer: null };
  // What the server last said.
  const shown = { locks: new Map(), timelines: new Map(), nextStartAfter: null };

  function token() {
    return sessionStorage.getItem(TOKEN_KEY);
  }

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function setStatus(text, kind) {
    const status = $("status");
    status.textContent = text;
    status.className = "status " + kind;
  }

  function formatMs(ms) {
    if (ms === null || ms === undefined) return "";
    if (ms < 10000) return (ms / 1000).toFixed(1) + " s";
    const s = Math.round(ms / 1000);
    if (s < 120) return s + " s";
    const m = Math.floor(s / 60);
    if (m < 120) return m + " min " + (s % 60) + " s";
    return Math.floor(m / 60) + " h " + (m % 60) + " min";
  }

  function formatTime(unixMs) {
    return new Date(unixMs).toLocaleTimeString();
  }

  // Connecting and reading the live view.

  function connect() {
    if (view.controller) view.controller.abort();
    clearTimeout(view.retryTimer);
    const controller = new AbortController();
    view.controller = controller;
    const params = new URLSearchParams();
    if (view.prefix) params.set("prefix", view.prefix);
    if (view.startAfter !== null) params.set("start_after", view.startAfter);
    const headers = {};
    const bearer = token();
    if (bearer) headers.Authorization = "Bearer " + bearer;
    $("forget-token").hidden = !bearer;
    setStatus("connecting…", "connecting");
    fetch("/api/stream?" + params.toString(), { headers, signal: controller.signal, cache: "no-store" })
      .then(async (response) => {
        if (!response.ok) {
          const body = await response.json().catch(() => ({}));
          const message = body.error || response.status + " " + response.statusText;
          if (response.status === 401 || response.status === 403) {
            showRefusal(response.status, message);
            return;
          }
          throw new Error(message);
        }
        view.retryMs = RETRY_MS_MIN;
        setStatus("live", "live");
        await readEvents(response.body);
        if (!controller.signal.aborted) retry("the server ended the live view");
      })
      .catch((error) => {
        if (!controller.signal.aborted) retry(error.message);
      });
  }

  function retry(reason) {
    setStatus("reconnecting in " + view.retryMs / 1000 + " s (" + reason + ")", "connecting");
    view.retryTimer = setTimeout(connect, view.retryMs);
    view.retryMs = Math.min(view.retryMs * 2, RETRY_MS_MAX);
  }

  // Server-sent events: blocks separated by a blank line, `event:` and `data:` lines.
  async function readEvents(body) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = "message";
        let data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (data) handle(name, JSON.parse(data));
      }
    }
  }

  function handle(name, data) {
    switch (name) {
      case "snapshot":
        showPage(data, true);
        break;
      case "refresh":
        showPage(data, false);
        break;
      case "change":
        applyChange(data);
        break;
      case "refused":
        showRefusal(403, data.error);
        break;
      default:
        break;
    }
  }

  // The state shown.

  function showPage(page, withTimelines) {
    hideRefusal();
    const receivedAt = Date.now();
    shown.locks = new Map();
    for (const lock of page.locks) {
      lock.receivedAt = receivedAt;
      shown.locks.set(lock.name, lock);
      if (withTimelines || !shown.timelines.has(lock.name)) {
        shown.timelines.set(lock.name, lock.timeline || []);
      }
    }
    for (const name of shown.timelines.keys()) {
      if (!shown.locks.has(name)) shown.timelines.delete(name);
    }
    shown.nextStartAfter = page.next_start_after;
    $("identity").textContent = page.identity ? "identity: " + page.identity : "";
    showCluster(page);
    renderLocks();
    const notes = [];
    if (page.next_start_after !== null) {
      notes.push("More locks match than this page shows: narrow the prefix, or go to the next page.");
    }
    if (page.timeline_missed_events > 0) {
      notes.push("This node's timeline missed " + page.timeline_missed_events + " events while it was behind.");
    }
    $("page-note").textContent = notes.join(" ");
    $("next-page").hidden = page.next_start_after === null;
    $("first-page").hidden = view.startAfter === null;
  }

  function inPage(name) {
    return name.startsWith(view.prefix)
      && (view.startAfter === null || name > view.startAfter)
      && (shown.nextStartAfter === null || name <= shown.nextStartAfter);
  }

  function applyChange(change) {
    let lock = shown.locks.get(change.lock);
    if (!lock) {
      if (!inPage(change.lock)) return;
      lock = {
        name: change.lock, holder: null, sharer_count: 0, sharers: [], permits: null, last_token: 0,
        waiters: 0, waiting_sessions: [], waiting_modes: [], lock_delay_remaining_ms: null,
      };
      shown.locks.set(change.lock, lock);
    }
    lock.receivedAt = Date.now();
    const sameGrant = (grant) => grant.session === change.session && grant.token === change.token;
    if (change.kind === "granted") {
      // The lease is in the next refresh; the grant is news now.
      const grant = { session: change.session, token: change.token, lease_remaining_ms: null, access: change.access, slot: change.slot };
      if (change.access === "shared" || change.access === "slot") {
        lock.sharers = lock.sharers.filter((sharer) => sharer.session !== change.session).concat([grant]);
        lock.sharer_count = Math.max(lock.sharer_count, lock.sharers.length);
      } else {
        lock.holder = grant;
      }
      lock.last_token = Math.max(lock.last_token, change.token);
    } else if (lock.holder && sameGrant(lock.holder)) {
      lock.holder = null;
    } else if (lock.sharers.some(sameGrant)) {
      lock.sharers = lock.sharers.filter((sharer) => !sameGrant(sharer));
      lock.sharer_count = Math.max(0, lock.sharer_count - 1);
    }
    if (lock.waiting_sessions.length > change.waiters) {
      lock.waiting_sessions = lock.waiting_sessions.slice(0, change.waiters);
      lock.waiting_modes = lock.waiting_modes.slice(0, change.waiters);
    }
    lock.waiters = change.waiters;
    const timeline = shown.timelines.get(change.lock) || [];
    timeline.push({
      kind: change.kind, session: change.session, token: change.token, at_unix_ms: change.at_unix_ms,
      access: change.access, slot: change.slot,
    });
    while (timeline.length > TIMELINE_EVENTS_PER_LOCK_MAX) timeline.shift();
    shown.timelines.set(change.lock, timeline);
    renderLocks();
  }

  function showCluster(page) {
    // The cluster is shown only to an identity that may administer it (null for the others).
    const cluster = page.cluster || { term: null, leader: null, members: [] };
    $("served-by").textContent = "served by node " + page.served_by.node_id + " (" + page.served_by.role
      + ")" + (page.cluster ? ", term " + cluster.term : "")
      + (page.served_by.role === "leader" ? "" : "; this node's own copy, possibly behind the leader");
    $("members-note").textContent = page.cluster ? "" : "The cluster's members are shown to identities with the admin right only.";
    const rows = document.createDocumentFragment();
    for (const member of cluster.members) {
      const tr = el("tr");
      tr.append(el("td", member.id + (member.id === page.served_by.node_id ? " (this page)" : "")));
      tr.append(el("td", member.addr));
      tr.append(el("td", member.voter ? "voter" : "learner"));
      tr.append(el("td", member.id === cluster.leader ? "leader" : "", member.id === cluster.leader ? "leader" : ""));
      rows.append(tr);
    }
    $("members").replaceChildren(rows);
  }

  // How a lock is held: by one holder, by the readers of a shared phase, or by a semaphore's
  // permits (see docs/locks.md).
  function heldAs(lock) {
    if (lock.permits !== null && lock.permits !== undefined) {
      return lock.permits + " permits, " + Math.max(0, lock.permits - lock.sharer_count) + " free";
    }
    if (lock.sharer_count > 0) {
      return "shared phase, " + lock.sharer_count + (lock.sharer_count === 1 ? " reader" : " readers");
    }
    return lock.holder ? "exclusive" : "";
  }

  // A cell of one line per holder: the exclusive holder, or each reader or permit holder.
  function perHolder(lock, className, line) {
    const cell = el("td", null, className);
    const holders = lock.holder ? [lock.holder] : lock.sharers;
    for (const holder of holders) {
      const text = line(holder);
      if (typeof text === "string" || typeof text === "number") cell.append(el("div", text));
      else cell.append(text);
    }
    if (!lock.holder && lock.sharer_count > lock.sharers.length) {
      cell.append(el("div", "… " + (lock.sharer_count - lock.sharers.length) + " more", "more"));
    }
    return cell;
  }

  function accessText(grant) {
    if (grant.access === "slot") return "slot " + grant.slot;
    return grant.access === "shared" ? "shared" : "";
  }

  function renderLocks() {
    const names = Array.from(shown.locks.keys()).sort();
    const rows = document.createDocumentFragment();
    for (const name of names) {
      const lock = shown.locks.get(name);
      const holder = lock.holder;
      const held = holder || lock.sharers.length > 0;
      const tr = el("tr", null, held ? "held" : "free");
      tr.dataset.lock = name;
      tr.append(el("td", name, "name"));
      tr.append(el("td", heldAs(lock), "mode"));
      tr.append(perHolder(lock, "session", (grant) => (grant.access === "slot" ? "slot " + grant.slot + ": " : "") + grant.session));
      if (held) {
        // Every reader of a phase has the phase's token: it is shown once.
        const phase = !holder && lock.permits === null && lock.sharers.length > 0;
        tr.append(phase ? el("td", "phase " + lock.sharers[0].token, "token") : perHolder(lock, "token", (grant) => grant.token));
      } else {
        tr.append(el("td", lock.last_token ? "last " + lock.last_token : "", "token"));
      }
      let lease;
      if (held) {
        lease = perHolder(lock, "lease", (grant) => {
          const line = el("div", grant.lease_remaining_ms === null ? "…" : "");
          if (grant.lease_remaining_ms !== null) line.dataset.until = String(lock.receivedAt + grant.lease_remaining_ms);
          return line;
        });
      } else {
        lease = el("td", "", "lease");
        if (lock.lock_delay_remaining_ms !== null) {
          lease.dataset.delayUntil = String(lock.receivedAt + lock.lock_delay_remaining_ms);
        }
      }
      tr.append(lease);
      const waiting = lock.waiting_sessions.map((session, i) => "s" + session + " " + (lock.waiting_modes[i] || "exclusive")).join(", ")
        + (lock.waiters > lock.waiting_sessions.length ? ", …" : "");
      tr.append(el("td", lock.waiters ? lock.waiters + " (" + waiting + ")" : "0", "waiters"));
      // A holder's value (leader election: its address), when the server sends one.
      tr.append(el("td", holder && holder.value !== undefined && holder.value !== null ? holder.value : "", "value"));
      const events = el("td", null, "events");
      for (const entry of shown.timelines.get(name) || []) {
        const access = entry.kind === "granted" && entry.access ? accessText(entry) : "";
        const badge = el("span", entry.kind + (access ? " " + access : "") + " #" + entry.token + " s" + entry.session, "event " + entry.kind);
        badge.title = formatTime(entry.at_unix_ms);
        events.append(badge);
      }
      tr.append(events);
      rows.append(tr);
    }
    $("lock-rows").replaceChildren(rows);
    tickLeases();
  }

  // Leases count down between refreshes.
  function tickLeases() {
    const now = Date.now();
    for (const cell of document.querySelectorAll("#lock-rows [data-until], #lock-rows [data-delay-until]")) {
      if (cell.dataset.until) cell.textContent = formatMs(Math.max(0, Number(cell.dataset.until) - now));
      else if (cell.dataset.delayUntil) cell.textContent = "lock-delay " + formatMs(Math.max(0, Number(cell.dataset.delayUntil) - now));
    }
  }

  // Authentication.

  function showRefusal(status, message) {
    if (view.controller) view.controller.abort();
    shown.locks = new Map();
    shown.timelines = new Map();
    renderLocks();
    $("members").replaceChildren();
    $("view").hidden = true;
    $("auth").hidden = false;
    $("auth-message").textContent = (status === 401 ? "This server requires a bearer token: " : "Refused: ") + message;
    setStatus(status === 401 ? "authentication required" : "refused", "refused");
  }

  function hideRefusal() {
    $("auth").hidden = true;
    $("view").hidden = false;
  }

  function prefixChanged() {
    const prefix = $("prefix").value;
    if (new TextEncoder().encode(prefix).length > PREFIX_BYTES_MAX) {
      $("filter-note").textContent = "A prefix is at most " + PREFIX_BYTES_MAX + " bytes.";
      $("filter-note").className = "note bad";
      return;
    }
    $("filter-note").textContent = "";
    $("filter-note").className = "note";
    view.prefix = prefix;
    view.startAfter = null;
    connect();
  }

  document.addEventListener("DOMContentLoaded", () => {
    let debounce = null;
    $("prefix").addEventListener("input", () => {
      clearTimeout(debounce);
      debounce = setTimeout(prefixChanged, 250);
    });
    $("auth-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      connect();
    });
    $("forget-token").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      connect();
    });
    $("next-page").addEventListener("click", () => {
      if (shown.nextStartAfter === null) return;
      view.startAfter = shown.nextStartAfter;
      connect();
    });
    $("first-page").addEventListener("click", () => {
      view.startAfter = null;
      connect();
    });
    setInterval(tickLeases, 500);
    connect();
  });
})();
