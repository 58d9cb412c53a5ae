// The dashboard in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core;
// no browser is downloaded). One broker with JWT on and its own private PostgreSQL serves every
// test; the tests run in order and build on each other's data. Screenshots of each page go to
// tests/browser/screenshots/ (ignored by git).
//
//   QUEEN_BROKER_BIN  the broker binary (default: $CARGO_TARGET_DIR/debug/queen-broker, else
//                     ../../target/debug/queen-broker)
//   CHROMIUM_PATH     the browser (default /usr/bin/chromium)

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHmac } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const SHOTS = join(here, "screenshots");
const SECRET = "browser-test-secret-of-32-bytes!!";
const WAIT = 15_000;

let broker;
let brokerLog = "";
let base;
let work;
let browser;
let page;

function brokerBinary() {
  if (process.env.QUEEN_BROKER_BIN) return process.env.QUEEN_BROKER_BIN;
  const target = process.env.CARGO_TARGET_DIR || resolve(here, "../../target");
  return join(target, "debug", "queen-broker");
}

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.on("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

const b64 = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");

/** An HS256 token with `role`, valid for ten minutes. */
function token(sub, role) {
  const now = Math.floor(Date.now() / 1000);
  const head = `${b64({ alg: "HS256", typ: "JWT" })}.${b64({ sub, role, iat: now, exp: now + 600 })}`;
  return `${head}.${createHmac("sha256", SECRET).update(head).digest("base64url")}`;
}
const ADMIN = token("ops", "admin");
const READER = token("viewer", "read-only");

/** One API call as the admin. */
async function api(method, path, body) {
  const res = await fetch(base + path, {
    method,
    headers: { Authorization: `Bearer ${ADMIN}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  assert.ok(res.ok, `${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

const push = (queue, payloads, partition) =>
  api("POST", "/api/v1/push", { items: payloads.map((payload) => ({ queue, partition, payload })) });

async function pop(queue, group, batch) {
  const body = await api("GET", `/api/v1/pop/queue/${queue}?consumerGroup=${group}&batch=${batch}&wait=false`);
  return body ? body.messages : [];
}

const ack = (group, messages, status = "completed", error) =>
  api("POST", "/api/v1/ack/batch", {
    consumerGroup: group,
    acknowledgments: messages.map((m) => ({
      transactionId: m.transactionId, partitionId: m.partitionId, leaseId: m.leaseId, status, error,
    })),
  });

const shot = (name) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });

/** Waits until the text of `selector` satisfies `check` (the page refreshes itself). */
async function waitText(selector, check, what) {
  const deadline = Date.now() + WAIT;
  let last = null;
  while (Date.now() < deadline) {
    last = await page.locator(selector).first().textContent({ timeout: 1000 }).catch(() => null);
    if (last !== null && check(last.trim())) return last.trim();
    await page.waitForTimeout(100);
  }
  assert.fail(`${what}: ${selector} still reads ${JSON.stringify(last)}`);
}

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  work = mkdtempSync(join(tmpdir(), "queen-browser-"));
  const port = await freePort();
  const probe = await freePort(); // nothing listens there: the broker starts its own PostgreSQL
  base = `http://127.0.0.1:${port}`;
  const bin = brokerBinary();
  assert.ok(existsSync(bin), `broker binary ${bin} (build it with cargo build)`);
  broker = spawn(bin, [], {
    env: {
      ...process.env,
      HOST: "127.0.0.1",
      PORT: String(port),
      QUEEN_CONFIG: "",
      QUEEN_PRIVATE_PG_DIR: join(work, "pg"),
      QUEEN_PRIVATE_PG_PROBE: `127.0.0.1:${probe}`,
      FILE_BUFFER_DIR: join(work, "spool"),
      JWT_ENABLED: "true",
      JWT_SECRET: SECRET,
      // Samples twice a second, so the charts fill within the test (10 s in production).
      QUEEN_HISTORY_INTERVAL_MS: "500",
      LOG_LEVEL: "warn",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  broker.stdout.on("data", (d) => { brokerLog += d; });
  broker.stderr.on("data", (d) => { brokerLog += d; });
  const deadline = Date.now() + 60_000;
  for (;;) {
    assert.equal(broker.exitCode, null, `broker exited:\n${brokerLog}`);
    const ok = await fetch(`${base}/health`).then((r) => r.ok, () => false);
    if (ok) break;
    assert.ok(Date.now() < deadline, `broker not healthy within 60 s:\n${brokerLog}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM_PATH || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("pageerror", (e) => { throw e; });
});

after(async () => {
  await browser?.close();
  if (broker && broker.exitCode === null) {
    const exited = new Promise((r) => broker.once("exit", r));
    broker.kill("SIGTERM"); // the broker stops its private PostgreSQL on the way out
    await Promise.race([exited, new Promise((r) => setTimeout(r, 20_000))]);
  }
  if (work) rmSync(work, { recursive: true, force: true });
});

test("the page asks for a token and keeps it for the tab only", async () => {
  const res = await fetch(`${base}/`);
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-security-policy"), /default-src 'none'/);
  await page.goto(`${base}/?refresh=1`);
  await page.locator("#login").waitFor({ timeout: WAIT });
  await shot("sign-in");
  await page.fill("#token", "not-a-token");
  await page.press("#token", "Enter");
  await waitText("[role=alert]", (t) => t.includes("refused this token"), "a bad token is refused");
  await page.fill("#token", ADMIN);
  await page.click("button[type=submit]");
  await waitText("h1", (t) => t === "Overview", "the overview after sign-in");
  const stored = await page.evaluate(() => [sessionStorage.getItem("queen.token"), localStorage.length]);
  assert.deepEqual(stored, [ADMIN, 0]);
  await waitText("#session", (t) => t.includes("signed in as ops"), "who is signed in");
  // Keyboard: on a fresh load the first Tab reaches the skip link.
  await page.reload();
  await waitText("h1", (t) => t === "Overview", "the overview after a reload (same tab, same token)");
  await page.keyboard.press("Tab");
  assert.equal(await page.evaluate(() => document.activeElement.textContent), "Skip to content");
});

test("the overview shows a queue after pushes", async () => {
  await push("web-orders", [1, 2, 3, 4, 5].map((n) => ({ order: n, item: "book" })), "eu");
  const row = '#main tr[data-queue="web-orders"]';
  await waitText(`${row} td:nth-of-type(3)`, (t) => t === "5", "total of web-orders");
  await waitText(`${row} td:nth-of-type(4)`, (t) => t === "5", "pending of web-orders");
  await waitText("#card-database dd", (t) => t.startsWith("healthy"), "database health");
  await waitText("#card-broker dd", (t) => t.startsWith("v0."), "broker version");
});

test("the lag goes down after pops and acks", async () => {
  const first = await pop("web-orders", "web-billing", 1); // the group starts, holding a lease
  assert.equal(first.length, 1);
  const backlog = '#main tr[data-group="web-billing"] td[data-backlog]';
  await waitText(backlog, (t) => t === "5", "backlog before any ack");
  await ack("web-billing", first);
  await waitText(backlog, (t) => t === "4", "backlog after one ack");
  await ack("web-billing", await pop("web-orders", "web-billing", 3));
  await waitText(backlog, (t) => t === "1", "backlog after four acks");
  await shot("overview");
});

/** The `data-points` of a chart once it has at least `n` points with data. */
async function chartPoints(selector, n, what) {
  const deadline = Date.now() + WAIT;
  let last = null;
  while (Date.now() < deadline) {
    last = await page.locator(selector).first().getAttribute("data-points", { timeout: 1000 }).catch(() => null);
    if (Number(last) >= n) return Number(last);
    await page.waitForTimeout(100);
  }
  assert.fail(`${what}: ${selector} has ${last} points`);
}

test("charts draw the broker's last hour, and the tiles show real values", async () => {
  await page.goto(`${base}/?refresh=1`);
  await waitText("h1", (t) => t === "Overview", "the overview");
  // Traffic spread over a few samples: pushes to several partitions, a group that lags.
  for (let i = 0; i < 3; i++) {
    await push("web-charts", [1, 2, 3, 4].map((n) => ({ n, i })), `c${i}`);
    await ack("web-charts-reader", await pop("web-charts", "web-charts-reader", 2));
    await chartPoints("#chart-rates", 2 * (i + 2), "the rates chart grows with the samples");
  }
  for (const id of ["#chart-rates", "#chart-backlog", "#chart-age", "#chart-commit", "#chart-spool"]) {
    assert.ok(await page.locator(`${id} svg .series`).count() >= 1, `${id} draws a line`);
  }
  // The backlog chart's lines are the real backlogs: web-billing left 1 message on web-orders,
  // web-charts-reader took 6 of 12.
  const legend = (id) => page.locator(`${id} .legend`).textContent();
  await waitText("#chart-backlog .legend", (t) => t.includes("web-orders · web-billing 1"), "web-billing's backlog");
  await waitText("#chart-backlog .legend", (t) => t.includes("web-charts · web-charts-reader 6"), "the reader's backlog");
  assert.match(await legend("#chart-rates"), /pushed/);
  assert.match(await legend("#chart-commit"), /p99 \d+(\.\d)? ms/);
  const label = await page.locator("#chart-rates svg").getAttribute("aria-label");
  assert.match(label, /^Messages per second, \d\d:\d\d–\d\d:\d\d UTC; latest pushed: /);
  // The pool tile names every pool with connections in use and their size.
  await waitText("#card-database dd", (t) => /in use: shared \d+\/\d+ · lease \d+\/\d+ · claims \d+\/\d+ · acks \d+\/\d+/.test(t), "the pool tile");
  for (const card of await page.locator(".cards .card dd").allTextContents()) {
    assert.doesNotMatch(card, /^—|undefined|NaN/, `a tile without a value: ${card}`);
  }
  await shot("overview-charts");

  await page.goto(`${base}/#/queues/web-charts`);
  await waitText("h1", (t) => t === "Queue web-charts", "queue page");
  await chartPoints("#queue-chart-backlog", 2, "the queue's backlog chart");
  await waitText("#queue-chart-backlog .legend", (t) => t.includes("web-charts-reader 6"), "the queue's group backlog");
  assert.ok(await page.locator("#queue-chart-age svg .series").count() >= 1, "the age chart draws a line");
  assert.doesNotMatch(await page.locator("#queue-chart-backlog .legend").textContent(), /web-orders|web-billing/, "only this queue's groups");
  await shot("queue-charts");
});

test("a queue shows its options, partitions, groups and messages with payloads", async () => {
  await page.goto(`${base}/#/queues/web-orders`);
  await waitText("h1", (t) => t === "Queue web-orders", "queue page");
  await waitText("#queue-options", (t) => t.includes("leaseTime"), "options");
  assert.match(await page.locator("main").textContent(), /page 1 of 1 \(1 partitions\)/);
  const groupRow = 'tr[data-group="web-billing"]';
  assert.equal((await page.locator(`${groupRow} td`).first().textContent()).trim(), "1");
  const preview = page.locator("td.preview code").first();
  assert.match(await preview.textContent(), /"order":5/);
  await shot("queue");
  await page.locator("td a code").first().click();
  await waitText("h1", (t) => t === "Message", "message detail");
  const payload = await page.locator("#payload").textContent();
  assert.deepEqual(JSON.parse(payload), { order: 5, item: "book" });
  assert.match(payload, /\n {2}"order": 5/); // pretty-printed
  await shot("message");

  // A queue with many partitions shows them a page at a time.
  await api("POST", "/api/v1/push", {
    items: Array.from({ length: 120 }, (_, n) => ({ queue: "web-wide", partition: `p${String(n).padStart(3, "0")}`, payload: n })),
  });
  await page.goto(`${base}/#/queues/web-wide`);
  await waitText("main nav.pager", (t) => t.includes("page 1 of 3 (120 partitions)"), "the first page");
  const partitions = page.locator("main table", { has: page.locator("caption", { hasText: /^Partitions/ }) });
  assert.equal(await partitions.locator("tbody tr").count(), 50);
  await page.click("text=Next →");
  await waitText("main nav.pager", (t) => t.includes("page 2 of 3"), "the second page");
  await waitText('main caption:has-text("Partitions ")', (t) => t === "Partitions 51–100.", "rows of page 2");
  assert.equal(await partitions.locator("tbody tr th").first().textContent(), "p050");
});

test("a dead letter appears with its reason", async () => {
  await push("web-payments", [{ card: "4111" }]);
  await ack("web-risk", await pop("web-payments", "web-risk", 1), "dlq", "payment declined by the bank");
  await page.goto(`${base}/#/dlq`);
  await waitText("td.reason", (t) => t === "payment declined by the bank", "the reason");
  assert.match(await page.locator("main").textContent(), /1 dead letter\(s\)/);
  await page.fill("#dlq-queue", "web-orders");
  await page.press("#dlq-queue", "Enter");
  await waitText("main p.empty", (t) => t === "No dead letters.", "the filter");
  await page.goto(`${base}/#/dlq?queue=web-payments`);
  await waitText("td.reason", (t) => t.startsWith("payment declined"), "the filtered list");
  await shot("dlq");
  await page.click("text=Details");
  await waitText("#message-fields", (t) => t.includes("payment declined by the bank"), "the letter's detail");
});

test("consumer groups: seek to the end, and delete only after confirming", async () => {
  await page.goto(`${base}/#/groups`);
  await waitText("h1", (t) => t === "Consumer groups", "groups page");
  const row = 'tr[data-group="web-billing"][data-queue="web-orders"]';
  await waitText(`${row} td:nth-of-type(3)`, (t) => t === "1", "backlog before the seek");
  await shot("groups");
  await page.click(`${row} button:has-text("Seek to end")`);
  await waitText(`${row} td:nth-of-type(3)`, (t) => t === "0", "backlog after the seek");
  await page.click(`${row} button:has-text("Delete")`);
  await page.locator("dialog#confirm").waitFor();
  assert.match(await page.locator("#confirm-text").textContent(), /Delete consumer group web-billing on web-orders/);
  await page.keyboard.press("Escape"); // cancel
  await page.locator("dialog#confirm").waitFor({ state: "detached" });
  assert.equal(await page.locator(row).count(), 1, "cancelled: the group is still there");
  await page.click(`${row} button:has-text("Delete")`);
  await page.click("#confirm-ok");
  await page.locator(row).waitFor({ state: "detached", timeout: WAIT });
  const groups = await api("GET", "/api/v1/consumer-groups");
  assert.ok(!groups.some((g) => g.name === "web-billing" && g.queueName === "web-orders"));
});

test("maintenance toggles, and the spool count shows buffered pushes", async () => {
  await page.goto(`${base}/?refresh=1`);
  const toggle = page.locator("#toggle-maintenance");
  await toggle.waitFor({ timeout: WAIT });
  assert.equal(await toggle.getAttribute("aria-pressed"), "false");
  await toggle.click();
  await waitText("#toggle-maintenance", (t) => t === "Push maintenance: on", "the toggle");
  assert.equal(await page.locator("#toggle-maintenance").getAttribute("aria-pressed"), "true");
  const answers = await push("web-spooled", [1, 2, 3]);
  assert.deepEqual(answers.map((a) => a.status), ["buffered", "buffered", "buffered"]);
  await waitText("#spool-records", (t) => t === "3", "spool count on the overview");
  await waitText("#maintenance-state", (t) => t === "push", "maintenance state");
  await page.goto(`${base}/#/maintenance`);
  await waitText("#spool-count", (t) => t === "3", "spool count on the maintenance page");
  await waitText("#push-maintenance", (t) => t.startsWith("on"), "push maintenance on");
  await shot("maintenance");
  await page.click("#toggle-maintenance");
  await waitText("#push-maintenance", (t) => t === "off", "push maintenance off");
  await page.goto(`${base}/?refresh=1`);
  await waitText("#spool-records", (t) => t === "0", "the spool drains after maintenance");
  await waitText('tr[data-queue="web-spooled"] td:nth-of-type(3)', (t) => t === "3", "spooled pushes stored");
  await page.click("#toggle-pop-maintenance");
  await waitText("#maintenance-state", (t) => t === "pop", "pop maintenance on");
  const res = await fetch(`${base}/api/v1/pop/queue/web-spooled?wait=false`, { headers: { Authorization: `Bearer ${ADMIN}` } });
  assert.equal(res.status, 204, "pops answer empty in pop maintenance");
  await page.click("#toggle-pop-maintenance");
  await waitText("#maintenance-state", (t) => t === "off", "pop maintenance off");
});

test("KV namespaces, locks, timers, stream queries and ephemeral queues are listed", async () => {
  await api("POST", "/api/v1/kv", { operations: [
    { op: "put", ns: "web-carts", key: "c1", value: { items: 2 }, ttlSeconds: 30 },
    { op: "put", ns: "web-carts", key: "c2", value: 1, forever: true },
  ] });
  const lock = await api("POST", "/api/v1/locks", { operations: [{ op: "acquire", name: "web-nightly", ttlSeconds: 600, owner: "web-worker" }] });
  await api("POST", "/api/v1/timers", { operations: [
    { op: "schedule", queue: "web-reminders", timerKey: "r1", payload: Buffer.from('{"n":1}').toString("base64"), delayMs: 3_600_000 },
  ] });
  await api("POST", "/streams/v1/queries", { name: "web-totals", source_queue: "web-orders", config_hash: "h" });
  await api("POST", "/api/v1/ephemeral/push", { queue: "web-live", messages: [{ payload: { n: 1 } }, { payload: { n: 2 } }] });
  await page.goto(`${base}/#/state`);
  await waitText("h1", (t) => t === "KV, locks, timers, streams and ephemeral queues", "the state page");
  const cells = (sel) => page.locator(`${sel} td`).allTextContents();
  assert.deepEqual((await cells('tr[data-namespace="web-carts"]')).slice(0, 4), ["2", "16 B", "1", "1"]);
  const held = await cells('tr[data-lock="web-nightly"]');
  assert.deepEqual(held.slice(0, 3), ["0", "web-worker", String(lock.results[0].token)]);
  assert.deepEqual((await cells('tr[data-timers="web-reminders"]')).filter((_, i) => i !== 1), ["1", "on time", "0"]);
  const query = await cells('tr[data-query="web-totals"]');
  assert.deepEqual([query[0], query[2], query[6], query[7]], ["web-orders", "0", "0", "no cycle yet"]);
  const live = await cells('tr[data-ephemeral="web-live"]');
  assert.deepEqual([live[0], live[2], live[3], live[4]], ["2", "1", "2", "0"]);
  assert.match(await page.locator("#ephemeral-memory").textContent(), /^Memory: \d+ B of 256\.0 MB/);
  assert.doesNotMatch(await page.locator("main").textContent(), /null|undefined/);
  await shot("state");
});

test("the queue and group lists come a page at a time and the search boxes find by name", async () => {
  const names = Array.from({ length: 30 }, (_, i) => `paged-${String(i).padStart(2, "0")}`);
  await api("POST", "/api/v1/push", { items: names.map((queue) => ({ queue, payload: { n: 1 } })) });
  await pop("paged-07", "paged-readers", 1);
  await page.goto(`${base}/?refresh=0#/`);
  await waitText("h1", (t) => t === "Overview", "the overview");
  const total = (await api("GET", "/api/v1/resources/queues?limit=1")).total;
  const pages = Math.ceil(total / 25);
  await waitText("#queue-pages", (t) => t.includes(`page 1 of ${pages}`) && t.includes(`${total} queues`), "the queue pager");
  const queueRows = "#main tr[data-queue]:not([data-group])";
  assert.equal(await page.locator(queueRows).count(), 25, "one page of queues");
  await page.click("#queue-pages-next");
  await waitText("#queue-pages", (t) => t.includes(`page 2 of ${pages}`), "the second page");
  assert.equal(await page.locator(queueRows).count(), Math.min(25, total - 25));
  assert.match(await page.evaluate(() => location.hash), /qp=2/);

  await page.fill("#queue-search", "PAGED-1");
  await page.press("#queue-search", "Enter");
  await waitText("#queue-pages", (t) => t.includes("page 1 of 1") && t.includes("10 queues found"), "the search's pager");
  const found = await page.locator(queueRows).evaluateAll((rows) => rows.map((r) => r.dataset.queue));
  assert.deepEqual(found, names.slice(10, 20), "names containing the text, any case");
  await page.fill("#queue-search", "no-such-queue");
  await page.click("#queue-search-go");
  await waitText("#main .empty", (t) => t.includes("No queue name contains"), "an empty search says so");

  await page.fill("#group-search", "paged-read");
  await page.press("#group-search", "Enter");
  for (const deadline = Date.now() + WAIT; await page.locator("#main tr[data-group]").count() !== 1;) {
    assert.ok(Date.now() < deadline, "the group search leaves one row");
    await page.waitForTimeout(100);
  }
  await waitText('#main tr[data-group="paged-readers"] td[data-backlog]', (t) => t === "1", "the group found, with its backlog");
  await shot("overview-search");

  await page.goto(`${base}/?refresh=0#/kafka`);
  await waitText("h1", (t) => t === "Kafka", "the Kafka page");
  await waitText("#main", (t) => t.includes("No Kafka topics yet.") && t.includes("No Kafka groups yet."), "no Kafka topics or groups here");
  await shot("kafka");
});

test("a read-only token sees the data but no toggles or actions", async () => {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const reader = await context.newPage();
  try {
    // More than a page of queues by now: the search box finds this one.
    await reader.goto(`${base}/#/?qs=web-orders`);
    await reader.locator("#login").waitFor({ timeout: WAIT });
    await reader.fill("#token", READER);
    await reader.click("button[type=submit]");
    await reader.locator('#main tr[data-queue="web-orders"]').first().waitFor({ timeout: WAIT });
    assert.match(await reader.locator("#session").textContent(), /viewer \(read\)/);
    assert.equal(await reader.locator("#toggle-maintenance, #toggle-pop-maintenance").count(), 0);
    await reader.screenshot({ path: join(SHOTS, "overview-read-only.png"), fullPage: true });
    await reader.goto(`${base}/#/groups?s=web-risk`);
    await reader.locator("h1", { hasText: "Consumer groups" }).waitFor({ timeout: WAIT });
    await reader.locator('tr[data-group="web-risk"]').waitFor({ timeout: WAIT });
    assert.equal(await reader.locator("main button:not(form[role=search] button)").count(), 0, "no seek or delete");
    await reader.goto(`${base}/#/maintenance`);
    await reader.locator("h1", { hasText: "Maintenance" }).waitFor({ timeout: WAIT });
    await reader.locator("#spool-count").waitFor({ timeout: WAIT });
    assert.equal(await reader.locator("main button").count(), 0);
    assert.match(await reader.locator("main").textContent(), /needs the admin role/);
    // The other tab's session is its own.
    assert.equal(await reader.evaluate(() => sessionStorage.getItem("queen.token")), READER);
  } finally {
    await context.close();
  }
});
