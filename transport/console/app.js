// The convlog console: pick a conversation, read it live, send messages.
// All protocol work (SSE or polling, reconnects with Last-Event-ID,
// incarnations, truncations, projection, previews) is the JS client's; this
// file only renders its state.
import { Client } from "/client/convlog.js";

const $ = (id) => document.getElementById(id);
const client = new Client();
const params = new URLSearchParams(location.search);
const base = "/agents/:name/:instanceId";

let follower = null;
let conv = null; // {agent, instance, session}
let routes = new Set(); // "METHOD path" of every route the server registers
const openDetails = new Set(); // ids of expanded tool/thinking blocks, kept across renders

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c);
  return e;
}

const json = (v) => JSON.stringify(v, null, 2);
const short = (id) => (id && id.length > 12 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id ?? "");

function showError(err) {
  const box = $("error");
  if (!err) {
    box.hidden = true;
    box.textContent = "";
    return;
  }
  box.hidden = false;
  box.textContent = err.code ? `${err.code}: ${err.message}` : String(err.message ?? err);
}

// auth is the Authorization header for a server with access control: the
// token lives in this tab's sessionStorage only, never in the URL.
function auth() {
  const token = sessionStorage.getItem("convlog.token");
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function post(path, body) {
  const res = await fetch(path, {
    method: "POST",
    headers: { ...auth(), "Content-Type": "application/json", "Idempotency-Key": crypto.randomUUID() },
    body: JSON.stringify(body ?? {}),
  });
  const answer = await res.json().catch(() => ({}));
  if (!res.ok) throw Object.assign(new Error(answer.error?.message ?? `HTTP ${res.status}`), { code: answer.error?.code });
  return answer;
}

const has = (method, path) => routes.has(`${method} ${path}`);

// --- rendering -------------------------------------------------------------

function detailsBlock(key, cls, summary, ...body) {
  const d = el("details", { class: cls, open: openDetails.has(key) }, el("summary", {}, summary), ...body);
  d.addEventListener("toggle", () => (d.open ? openDetails.add(key) : openDetails.delete(key)));
  return d;
}

function renderPart(p, key) {
  switch (p.type) {
    case "text":
      return el("div", { class: "text" }, p.text);
    case "reasoning":
      return detailsBlock(key, "thinking", "Thinking", el("pre", {}, p.text));
    case "tool":
      return el(
        "div",
        { class: `tool ${p.state}` },
        el("div", {}, el("strong", {}, `tool ${p.toolName || ""}`), " ", el("span", { class: "state" }, p.state), " ", el("code", {}, short(p.toolCallId))),
        detailsBlock(`${key}:in`, "args", "arguments", el("pre", {}, json(p.input))),
        p.state === "output-error" ? el("pre", { class: "tool-error" }, `error: ${p.errorText}`) : null,
        p.state === "output-available" ? detailsBlock(`${key}:out`, "result", "result", el("pre", {}, json(p.output))) : null,
      );
    case "file":
      return p.mediaType.startsWith("image/")
        ? el("img", { class: "file", src: p.url, alt: p.filename ?? "" })
        : el("a", { href: p.url, download: p.filename ?? true }, `file: ${p.filename || p.mediaType}`);
    case "data":
      return el("div", { class: "data" }, el("pre", {}, `${p.name}: ${json(p.data)}`));
  }
  return null;
}

function renderMessage(m, actions) {
  const cls = ["msg", m.role];
  if (m.display === "diagnostic") cls.push("diagnostic");
  if (m.display === "hidden") cls.push("hidden-msg");
  const tags = [m.role];
  if (m.purpose !== m.role && m.purpose !== "user") tags.push(m.purpose);
  if (m.display !== "visible") tags.push(m.display);
  return el(
    "article",
    { class: cls.join(" "), "data-id": m.id, "data-role": m.role },
    el("header", {}, el("span", {}, tags.join(" · ")), m.submissionId ? el("code", { title: m.submissionId }, short(m.submissionId)) : null, ...actions),
    m.parts.map((p, i) => renderPart(p, `${m.id}:${i}`)),
  );
}

function renderSettlement(s) {
  const err = s.error ? ` — ${s.error.code ? s.error.code + ": " : ""}${s.error.message}${s.error.retryable ? " (retryable)" : ""}` : "";
  const by = s.answeredBySubmissionId ? ` (answered by ${short(s.answeredBySubmissionId)})` : "";
  return el("div", { class: "settlement", "data-submission": s.submissionId, "data-outcome": s.outcome }, "settled ", el("span", { class: s.outcome }, s.outcome), err + by);
}

function renderPending(submissionId) {
  return el(
    "div",
    { class: "settlement pending", "data-submission": submissionId },
    "running… ",
    el("button", { type: "button", onclick: () => abort(submissionId) }, "Abort"),
  );
}

function userActions(m, isLastUser) {
  const acts = [];
  if (has("POST", `${base}/rewind`)) acts.push(el("button", { type: "button", title: "rewind to before this message", onclick: () => mutate("/rewind", { entryId: m.id }) }, "Rewind"));
  if (has("POST", `${base}/fork`)) acts.push(el("button", { type: "button", title: "fork a new conversation up to here", onclick: () => fork(m.id) }, "Fork"));
  if (isLastUser && has("POST", `${base}/regenerate`)) acts.push(el("button", { type: "button", title: "answer this message again", onclick: () => mutate("/regenerate", { entryId: m.id }) }, "Regenerate"));
  return acts;
}

let scheduled = false;
function render() {
  if (scheduled) return;
  scheduled = true;
  requestAnimationFrame(() => {
    scheduled = false;
    draw();
  });
}

function draw() {
  if (!follower) return;
  const log = $("log");
  const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
  const { messages, settlements } = follower.view;
  const showHidden = $("showHidden").checked;
  const settled = new Map(settlements.map((s) => [s.submissionId, s]));
  const last = new Map(); // submission -> index of its last message
  messages.forEach((m, i) => m.submissionId && last.set(m.submissionId, i));
  const lastUser = messages.findLastIndex((m) => m.role === "user");
  const out = [];
  const placed = new Set();
  messages.forEach((m, i) => {
    if (m.display !== "hidden" || showHidden) out.push(renderMessage(m, m.role === "user" ? userActions(m, i === lastUser) : []));
    for (const [sub, at] of last) {
      if (at !== i) continue;
      placed.add(sub);
      const s = settled.get(sub);
      out.push(s ? renderSettlement(s) : renderPending(sub));
    }
  });
  for (const s of settlements) if (!placed.has(s.submissionId)) out.push(renderSettlement(s));
  for (const p of follower.previews.values()) {
    out.push(renderMessage({ id: `preview:${p.turnId}`, role: "assistant", purpose: "assistant", display: "visible", submissionId: p.submissionId, parts: p.parts }, []));
    out[out.length - 1].classList.add("preview");
  }
  log.replaceChildren(...out);
  if (atBottom) log.scrollTop = log.scrollHeight;

  const conn = $("conn");
  conn.className = `conn ${follower.status}`;
  conn.textContent = follower.status === "reconnecting" ? "reconnecting…" : follower.status;
  $("incarnation").textContent = follower.incarnation ?? "none yet";
  $("offset").textContent = follower.offset;
  $("transport").textContent = `via ${follower.transport === "sse" ? "SSE" : "polling"}${follower.reconnects ? ` · ${follower.reconnects} reconnects` : ""}${follower.resets ? ` · ${follower.resets} resets` : ""}`;
}

// --- actions ---------------------------------------------------------------

function open() {
  const agent = $("agent").value.trim();
  const instance = $("instance").value.trim();
  const session = $("session").value.trim() || "default";
  const live = $("live").value;
  if (!agent || !instance) return;
  const token = $("token").value.trim();
  if (token) sessionStorage.setItem("convlog.token", token);
  else sessionStorage.removeItem("convlog.token");
  client.headers = auth();
  follower?.close();
  showError(null);
  openDetails.clear();
  conv = { agent, instance, session };
  const q = new URLSearchParams({ agent, instance, session, live });
  history.replaceState(null, "", `${location.pathname}?${q}`);
  document.title = `${agent}/${instance} · convlog`;
  follower = client.follow(agent, instance, { session: session === "default" ? undefined : session, live });
  follower.subscribe((ev) => {
    if (ev.type === "error" || (ev.type === "done" && ev.reason === "error")) {
      // A dropped connection is shown by the status badge; the box is for
      // answers the user must act on.
      if (ev.error?.code) showError(ev.error);
    } else if (ev.type === "records" || ev.type === "reset") {
      if ($("error").dataset.sticky !== "1") showError(null);
    }
    render();
  });
  $("reset").hidden = !has("POST", `${base}/reset`);
  loadInstances(agent, instance);
  render();
}

async function send(ev) {
  ev.preventDefault();
  const text = $("text").value;
  if (!text.trim() || !conv) return;
  $("send").disabled = true;
  try {
    await client.send(conv.agent, conv.instance, text, { session: conv.session === "default" ? undefined : conv.session });
    $("text").value = "";
    showError(null);
  } catch (err) {
    showError(err);
  } finally {
    $("send").disabled = false;
    $("text").focus();
  }
}

async function abort(submissionId) {
  try {
    await client.abort(conv.agent, conv.instance, submissionId);
  } catch (err) {
    showError(err);
  }
}

// mutate calls a conversation route (rewind, regenerate, reset, fork); the
// session goes in the query, where each of them reads the conversation it
// changes (a fork's body "session" names its new conversation instead).
async function mutate(suffix, body) {
  try {
    return await post(client.url(conv.agent, conv.instance, suffix, { session: conv.session === "default" ? undefined : conv.session }), body);
  } catch (err) {
    showError(err);
    return null;
  }
}

async function fork(entryId) {
  const instanceId = prompt("Fork into instance:", `${conv.instance}-fork`);
  if (!instanceId) return;
  const made = await mutate("/fork", { entryId, instanceId });
  if (!made) return;
  $("instance").value = made.instanceId ?? instanceId;
  $("session").value = made.session ?? "default";
  open();
}

// --- listings, where the server has them -----------------------------------

function fill(id, values) {
  $(id).replaceChildren(...values.map((v) => el("option", { value: v })));
}

async function getJSON(path) {
  const res = await fetch(path, { headers: { ...auth(), Accept: "application/json" } });
  return res.ok ? res.json() : null;
}

async function loadInstances(agent, instance) {
  try {
    let known = false;
    if (has("GET", "/agents/:name")) {
      const r = await getJSON(`/agents/${encodeURIComponent(agent)}`);
      const ids = (r?.instances ?? []).map((i) => i.instanceId);
      fill("instances", ids);
      known = ids.includes(instance);
    }
    // Only for a listed instance: another is a 404 (it has no sessions yet).
    if (known && has("GET", `${base}/sessions`)) {
      const r = await getJSON(client.url(agent, instance, "/sessions"));
      fill("sessions", (r?.sessions ?? []).map((s) => s.session));
    }
  } catch {
    // Listings are a convenience: the text fields work without them.
  }
}

async function start() {
  try {
    const r = await getJSON("/console/routes.json");
    routes = new Set((r?.routes ?? []).map((x) => `${x.method} ${x.path}`));
    if (has("GET", "/agents")) {
      const a = await getJSON("/agents");
      fill("agents", (a?.agents ?? []).map((x) => x.name));
    }
  } catch {
    routes = new Set();
  }
  for (const k of ["agent", "instance", "session", "live"]) if (params.has(k)) $(k).value = params.get(k);
  $("token").value = sessionStorage.getItem("convlog.token") ?? "";
  $("pick").addEventListener("submit", (ev) => {
    ev.preventDefault();
    open();
  });
  $("composer").addEventListener("submit", send);
  $("text").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("showHidden").addEventListener("change", render);
  $("reset").addEventListener("click", () => confirm("Reset this conversation? Its records are removed.") && mutate("/reset", {}));
  open();
}

start();
