// Screenshots of the dashboard's charts after a broker has been under load for a while (not a
// test: `npm run history-shots`, MINUTES=5 by default). It starts the debug broker with its own
// private PostgreSQL and the production sampling interval (10 s), runs producers and two
// consumer groups (one keeps up, one falls behind), then saves the overview and a queue page
// to tests/browser/screenshots/history-overview.png and history-queue.png.
//
//   QUEEN_BROKER_BIN, CHROMIUM_PATH  as for dashboard.test.mjs
//   MINUTES                          how long the load runs (default 5)
//   IDLE_MINUTES                     how long the broker then stays idle before the screenshots
//                                    (default 0), so the charts show load and quiet
//   PAGE_FROM_DISK=1                 serve the page's files from dashboard/ (the working tree)
//                                    instead of the copies built into the broker, so a broker
//                                    started long ago shows the page as it is now

import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const SHOTS = join(here, "screenshots");
const MINUTES = Number(process.env.MINUTES || 5);
const IDLE_MINUTES = Number(process.env.IDLE_MINUTES || 0);
const FROM_DISK = process.env.PAGE_FROM_DISK === "1";
const PAGE_DIR = resolve(here, "../../dashboard");

const bin = process.env.QUEEN_BROKER_BIN
  || join(process.env.CARGO_TARGET_DIR || resolve(here, "../../target"), "debug", "queen-broker");
if (!existsSync(bin)) throw new Error(`broker binary ${bin} (build it with cargo build)`);

const freePort = () => new Promise((ok, fail) => {
  const s = createServer();
  s.on("error", fail);
  s.listen(0, "127.0.0.1", () => { const { port } = s.address(); s.close(() => ok(port)); });
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const work = mkdtempSync(join(tmpdir(), "queen-history-"));
const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const broker = spawn(bin, [], {
  env: {
    ...process.env, HOST: "127.0.0.1", PORT: String(port), QUEEN_CONFIG: "",
    QUEEN_PRIVATE_PG_DIR: join(work, "pg"), QUEEN_PRIVATE_PG_PROBE: `127.0.0.1:${await freePort()}`,
    FILE_BUFFER_DIR: join(work, "spool"), LOG_LEVEL: "warn",
  },
  stdio: ["ignore", "inherit", "inherit"],
});

async function call(method, path, body) {
  const res = await fetch(base + path, {
    method, headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function consume(queue, group, batch) {
  const popped = await call("GET", `/api/v1/pop/queue/${queue}?consumerGroup=${group}&batch=${batch}&wait=false`);
  const messages = popped ? popped.messages : [];
  if (messages.length) {
    await call("POST", "/api/v1/ack/batch", {
      consumerGroup: group,
      acknowledgments: messages.map((m) => ({ transactionId: m.transactionId, partitionId: m.partitionId, leaseId: m.leaseId, status: "completed" })),
    });
  }
}

try {
  for (let i = 0; ; i++) {
    if (await fetch(`${base}/health`).then((r) => r.ok, () => false)) break;
    if (i > 300) throw new Error("broker not healthy within 60 s");
    await sleep(200);
  }
  const until = Date.now() + MINUTES * 60_000;
  let n = 0;
  const loops = [
    (async () => { // producers: 40 messages every 200 ms over 8 partitions, a burst each minute
      while (Date.now() < until) {
        const burst = new Date().getSeconds() < 10 ? 4 : 1;
        const items = Array.from({ length: 40 * burst }, () => ({ queue: "bench-orders", partition: `p${n % 8}`, payload: { n: n++ } }));
        await call("POST", "/api/v1/push", { items });
        await call("POST", "/api/v1/push", { items: [{ queue: "bench-events", payload: { n } }] });
        await sleep(200);
      }
    })(),
    (async () => { while (Date.now() < until) { await consume("bench-orders", "billing", 100); await sleep(100); } })(),
    (async () => { while (Date.now() < until) { await consume("bench-orders", "audit", 20); await sleep(500); } })(),
    (async () => { while (Date.now() < until) { await consume("bench-events", "indexer", 5); await sleep(2000); } })(),
  ];
  await Promise.all(loops);
  console.log(`load done (${MINUTES} min); idle for ${IDLE_MINUTES} min`);
  await sleep(IDLE_MINUTES * 60_000);
  mkdirSync(SHOTS, { recursive: true });
  const chromiumPath = process.env.CHROMIUM_PATH || "/usr/bin/chromium";
  for (let i = 0; !existsSync(chromiumPath) && i < 60; i++) { // not installed yet: wait, keeping the history
    console.log(`waiting for ${chromiumPath}`);
    await sleep(30_000);
  }
  const browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox", "--disable-dev-shm-usage"] });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  if (FROM_DISK) {
    const types = { "app.js": "text/javascript", "app.css": "text/css" };
    await page.route(/\/(\?[^#]*)?$|\/dashboard\/app\.(js|css)$/, async (route) => {
      const url = new URL(route.request().url());
      const name = url.pathname === "/" ? "index.html" : url.pathname.split("/").pop();
      const upstream = await route.fetch(); // keeps the broker's headers (the content security policy)
      await route.fulfill({
        response: upstream,
        body: readFileSync(join(PAGE_DIR, name), "utf8"),
        headers: { ...upstream.headers(), "content-type": `${types[name] || "text/html"}; charset=utf-8` },
      });
    });
  }
  await page.goto(`${base}/?refresh=0`);
  await page.locator("#chart-rates svg").waitFor({ timeout: 20_000 });
  await page.screenshot({ path: join(SHOTS, "history-overview.png"), fullPage: true });
  await page.goto(`${base}/#/queues/bench-orders`);
  await page.locator("#queue-chart-backlog svg").waitFor({ timeout: 20_000 });
  await page.screenshot({ path: join(SHOTS, "history-queue.png") }); // the charts, not every row
  await browser.close();
  console.log(`screenshots in ${SHOTS}: history-overview.png, history-queue.png (${MINUTES} min of load)`);
} finally {
  const exited = new Promise((r) => broker.once("exit", r));
  broker.kill("SIGTERM");
  await Promise.race([exited, sleep(20_000)]);
  rmSync(work, { recursive: true, force: true });
}
