// The web console in a real browser (Debian's chromium through
// puppeteer-core) against a real convlog serve: send a message, watch the
// reply stream in, kill -9 and restart the server mid-answer, see the
// console reconnect with Last-Event-ID and go on with nothing repeated,
// then an incarnation change. Any console error or page error fails the
// test, except the browser's own network errors while the server is down,
// which the browser logs for every refused connection.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { join } from "node:path";
import puppeteer from "puppeteer-core";
import { Serve, eventually, haveServer } from "../../../jsclient/test/harness.js";

const chromium = process.env.CHROMIUM_BIN || "/usr/bin/chromium";
const shots = process.env.CONVLOG_SCREENSHOTS; // a folder, to refresh docs/
const skip = haveServer ? false : "CONVLOG_BIN is not set (run through go test ./transport/console)";
const records = (name) => fileURLToPath(new URL(`../../../../projection/testdata/${name}.records.json`, import.meta.url));

let srv, browser, page;
const problems = [];
let serverDown = false;
const streamRequests = [];
const apiRequests = [];

before(async () => {
  if (skip) return;
  srv = await Serve.start(["--echo-delay", "120ms"]);
  browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    // Root in a container: no user namespaces for the sandbox.
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
    timeout: 0,
  });
  page = await browser.newPage();
  // No wall-clock limits on waits: a loaded machine is slow, not broken;
  // node --test's own timeout ends a test that really hangs.
  page.setDefaultTimeout(0);
  await page.setViewport({ width: 1000, height: 640 });
  page.on("pageerror", (err) => problems.push(`page error: ${err.message}`));
  page.on("console", (msg) => {
    if (msg.type() !== "error" && msg.type() !== "warn") return;
    const text = msg.text();
    const where = msg.location()?.url ?? "";
    if (serverDown && /net::ERR_|Failed to load resource/.test(text)) return;
    problems.push(`console ${msg.type()}: ${text} ${where}`);
  });
  page.on("request", (req) => {
    if (req.url().includes("/stream")) streamRequests.push({ url: req.url(), lastEventId: req.headers()["last-event-id"] ?? null });
    if (req.url().includes("/agents/")) apiRequests.push({ method: req.method(), url: req.url(), authorization: req.headers().authorization ?? null });
  });
});

after(async () => {
  await browser?.close();
  await srv?.stop();
});

const text = (sel) => page.$$eval(sel, (els) => els.map((e) => e.textContent));
const conn = () => page.$eval("#conn", (e) => e.className);
const shot = async (name) => shots && page.screenshot({ path: join(shots, name) });

test("console: send, stream, kill -9 and restart the server, resume, reset", { skip }, async () => {
  await page.goto(`${srv.base}/console?agent=echo&instance=web-1`);
  await page.waitForSelector("#conn.live");

  // A first exchange that completes.
  await page.type("#text", "hello console");
  await page.keyboard.press("Enter");
  await page.waitForSelector('.settlement[data-outcome="completed"]');
  assert.deepEqual(await text(".msg.user .text"), ["hello console"]);
  assert.deepEqual(await text(".msg.assistant:not(.preview) .text"), ["hello console"]);

  // A long answer: watch it stream in as a preview.
  const words = Array.from({ length: 60 }, (_, i) => `word${i}`).join(" ");
  await page.type("#text", words);
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => (document.querySelector(".msg.preview .text")?.textContent ?? "").split(" ").length >= 4);
  const partial = (await text(".msg.preview .text"))[0];
  assert.ok(words.startsWith(partial.trim()), `preview ${partial}`);
  await shot("console-streaming.png");
  const offsetBefore = await page.$eval("#offset", (e) => e.textContent);
  const before = streamRequests.length;

  // kill -9 mid-answer, then restart on the same port and data.
  serverDown = true;
  await srv.down("SIGKILL");
  await page.waitForSelector("#conn.reconnecting");
  assert.match(await page.$eval("#conn", (e) => e.textContent), /reconnecting/);
  await shot("console-reconnecting.png");
  await srv.up();
  await page.waitForSelector("#conn.live");
  serverDown = false;

  // The interrupted turn is settled by recovery, never re-run; the console
  // resumed from where it was (Last-Event-ID) rather than from the start.
  await page.waitForSelector('.settlement[data-outcome="failed"]');
  assert.match((await text('.settlement[data-outcome="failed"]'))[0], /interrupted/);
  const resumed = streamRequests.slice(before).filter((r) => r.lastEventId !== null);
  assert.ok(resumed.length >= 1, `no resume: ${JSON.stringify(streamRequests.slice(before))}`);
  assert.equal(resumed[resumed.length - 1].lastEventId, offsetBefore);
  assert.equal((await text(".msg.preview")).length, 0, "a preview outlived its turn");

  // And the conversation goes on, live, with nothing repeated.
  await page.type("#text", "after the restart");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelectorAll('.settlement[data-outcome="completed"]').length === 2);
  assert.deepEqual(await text(".msg.user .text"), ["hello console", words, "after the restart"]);
  assert.deepEqual(await text(".msg.assistant:not(.preview) .text"), ["hello console", "after the restart"]);
  const ids = await page.$$eval(".msg[data-id]", (els) => els.map((e) => e.dataset.id));
  assert.equal(new Set(ids).size, ids.length, "a message is shown twice");

  // An incarnation change: the console discards what it showed and reads
  // the new incarnation from "0".
  const incBefore = await page.$eval("#incarnation", (e) => e.textContent);
  serverDown = true;
  const inc = await srv.resetStream("echo", "web-1");
  await page.waitForFunction((inc) => document.querySelector("#incarnation").textContent === inc, {}, inc);
  await page.waitForSelector("#conn.live");
  serverDown = false;
  assert.notEqual(inc, incBefore);
  assert.equal((await text(".msg")).length, 0);
  await page.type("#text", "a new incarnation");
  await page.keyboard.press("Enter");
  await page.waitForSelector('.settlement[data-outcome="completed"]');
  assert.deepEqual(await text(".msg.user .text"), ["a new incarnation"]);

  assert.deepEqual(problems, []);
});

test("console: tool calls, thinking, files and settlements render", { skip }, async () => {
  await page.goto("about:blank"); // no console left reconnecting meanwhile
  await srv.offline("import", "echo", "tools", "default", records("tools"));
  await srv.offline("import", "echo", "chat", "default", records("chat"));
  await page.goto(`${srv.base}/console?agent=echo&instance=tools&live=poll`);
  await page.waitForSelector('.settlement[data-outcome="failed"]');
  assert.equal(await conn(), "conn polling");
  const tools = await text(".tool");
  assert.equal(tools.length, 2);
  assert.match(tools[0], /list_issues.*output-available/);
  assert.match(tools[1], /fetch_labels.*output-error.*labels service unavailable/s);
  assert.match((await text(".settlement"))[1], /failed.*tool_error: labels service unavailable \(retryable\)/);
  assert.equal((await text(".msg.hidden-msg")).length, 0, "a hidden message is shown");
  await page.click("#showHidden");
  await page.waitForSelector(".msg.hidden-msg");
  await page.click(".tool details.result summary");
  await page.$eval("#log", (l) => (l.scrollTop = 0));
  await shot("console-tools.png");

  await page.goto(`${srv.base}/console?agent=echo&instance=chat`);
  await page.waitForSelector(".settlement");
  assert.equal(await page.$eval("details.thinking", (d) => d.open), false, "thinking starts collapsed");
  await page.click("details.thinking summary");
  assert.match((await text("details.thinking"))[0], /The image shows an animal/);
  assert.equal(await page.$$eval("img.file", (i) => i.length), 1);
  assert.deepEqual(problems, []);
});

// Runs where the server has the conversation routes (rewind, regenerate,
// fork, reset): the console shows their buttons only then.
test("console: rewind, regenerate, fork and reset buttons", { skip }, async (t) => {
  const { routes } = await (await fetch(`${srv.base}/console/routes.json`)).json();
  const has = (m, p) => routes.some((r) => r.method === m && r.path === `/agents/:name/:instanceId${p}`);
  if (!has("POST", "/rewind") || !has("POST", "/regenerate") || !has("POST", "/fork") || !has("POST", "/reset")) {
    t.skip("this server has no rewind, regenerate, fork or reset route");
    return;
  }
  page.removeAllListeners("dialog");
  page.on("dialog", (d) => (d.type() === "prompt" ? d.accept("web-forked") : d.accept()));
  await page.goto(`${srv.base}/console?agent=echo&instance=web-buttons`);
  await page.waitForSelector("#conn.live");
  // The instance field offers the agent's instances (GET /agents/:name).
  await page.waitForFunction(() => [...document.querySelectorAll("#instances option")].some((o) => o.value === "web-1"));
  for (const msg of ["first", "second"]) {
    await page.type("#text", msg);
    await page.keyboard.press("Enter");
    await page.waitForFunction((n) => document.querySelectorAll('.settlement[data-outcome="completed"]').length === n, {}, msg === "first" ? 1 : 2);
  }
  // Regenerate the last answer: a new submission answers "second" again.
  const regenerate = await page.$$('.msg.user button[title^="answer this message again"]');
  assert.equal(regenerate.length, 1, "only the last user message has Regenerate");
  await regenerate[0].click();
  await page.waitForFunction(() => document.querySelectorAll('.settlement[data-outcome="completed"]').length === 3);
  assert.deepEqual(await text(".msg.user .text"), ["first", "second"]);
  // Rewind to before "second": only "first" and its answer stay.
  const rewind = await page.$$('.msg.user button[title^="rewind"]');
  await rewind[1].click();
  await page.waitForFunction(() => document.querySelectorAll(".msg.user").length === 1);
  assert.deepEqual(await text(".msg.user .text"), ["first"]);
  assert.deepEqual(await text(".msg.assistant:not(.preview) .text"), ["first"]);
  // Fork from "first" into another instance: the console opens it.
  await page.click('.msg.user button[title^="fork"]');
  await page.waitForFunction(() => new URLSearchParams(location.search).get("instance") === "web-forked");
  await page.waitForFunction(() => document.querySelectorAll(".msg.user").length === 1);
  assert.deepEqual(await text(".msg.user .text"), ["first"]);
  // Reset: a new incarnation, read from "0".
  const inc = await page.$eval("#incarnation", (e) => e.textContent);
  await page.click("#reset");
  await page.waitForFunction((inc) => document.querySelector("#incarnation").textContent !== inc, {}, inc);
  await page.waitForFunction(() => document.querySelectorAll(".msg").length === 0);
  assert.deepEqual(problems, []);
});

test("console: a token is sent as Authorization on every API request", { skip }, async () => {
  await page.goto(`${srv.base}/console?agent=echo&instance=web-token`);
  await page.waitForSelector("#conn.live");
  await page.type("#token", "t0ken");
  const from = apiRequests.length;
  await page.click('#pick button[type="submit"]');
  await page.waitForSelector("#conn.live");
  await page.type("#text", "with a token");
  await page.keyboard.press("Enter");
  await page.waitForSelector('.settlement[data-outcome="completed"]');
  const sent = apiRequests.slice(from);
  assert.ok(sent.some((r) => r.method === "POST") && sent.some((r) => r.url.includes("/stream")), JSON.stringify(sent));
  assert.deepEqual(sent.filter((r) => r.authorization !== "Bearer t0ken"), []);
  // Kept for the tab, not put in the URL.
  assert.ok(!page.url().includes("t0ken"));
  await page.reload();
  assert.equal(await page.$eval("#token", (e) => e.value), "t0ken");
  await page.$eval("#token", (e) => (e.value = ""));
  await page.click('#pick button[type="submit"]');
  assert.deepEqual(problems, []);
});
