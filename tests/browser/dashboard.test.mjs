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

test("a read-only token sees the data but no toggles or actions", async () => {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const reader = await context.newPage();
  try {
    await reader.goto(`${base}/`);
    await reader.locator("#login").waitFor({ timeout: WAIT });
    await reader.fill("#token", READER);
    await reader.click("button[type=submit]");
    await reader.locator('#main tr[data-queue="web-orders"]').waitFor({ timeout: WAIT });
    assert.match(await reader.locator("#session").textContent(), /viewer \(read\)/);
    assert.equal(await reader.locator("#toggle-maintenance, #toggle-pop-maintenance").count(), 0);
    await reader.screenshot({ path: join(SHOTS, "overview-read-only.png"), fullPage: true });
    await reader.goto(`${base}/#/groups`);
    await reader.locator("h1", { hasText: "Consumer groups" }).waitFor({ timeout: WAIT });
    await reader.locator('tr[data-group="web-risk"]').waitFor({ timeout: WAIT });
    assert.equal(await reader.locator("main button").count(), 0, "no seek or delete");
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
