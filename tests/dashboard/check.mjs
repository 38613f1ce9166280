// Opens the dashboard in headless Chromium as a tenant, selects the whole
// time range, and prints (JSON) what the page shows: the totals tiles, the
// sum of every chart's bars per NF version, the legends, the module and
// deployment tables, the bill total and the downloaded CSV bill. The Rust
// test compares all of it with the API's own answers.
//
// usage: node check.mjs <gateway url> <api key | sign-in link from `sluice dashboard`>
import { chromium } from "playwright-core";
import { readFileSync } from "node:fs";

const [url, key] = process.argv.slice(2);
if (!url || !key) {
  console.error("usage: node check.mjs <gateway url> <api key | sign-in link>");
  process.exit(2);
}
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
});
try {
  const context = await browser.newContext({ acceptDownloads: true });
  const page = await context.newPage();
  const foreign = [];
  const errors = [];
  page.on("request", (r) => { if (!r.url().startsWith(url) && !r.url().startsWith("blob:")) foreign.push(r.url()); });
  page.on("pageerror", (e) => errors.push(String(e)));
  if (key.startsWith("http")) {
    // A `sluice dashboard` link signs in by itself.
    await page.goto(key);
  } else {
    await page.goto(`${url}/dashboard`);
    await page.fill("#key", key);
    await page.click("#sign-in");
  }
  await page.waitForSelector("#app:not([hidden])");
  await page.selectOption("#range", "all");
  await page.waitForFunction(() =>
    ["chart-packets", "chart-bytes", "chart-cpu"].every((id) => document.getElementById(id).dataset.range === "all"));
  await page.waitForSelector("#bill-total");
  const shown = await page.evaluate(() => {
    const charts = {};
    for (const el of document.querySelectorAll(".chart")) {
      const bars = {};
      for (const r of el.querySelectorAll("rect.bar")) bars[r.dataset.nf] = (bars[r.dataset.nf] || 0) + Number(r.dataset.value);
      const legend = {};
      for (const li of el.querySelectorAll(".legend li")) legend[li.dataset.nf] = Number(li.dataset.total);
      charts[el.dataset.metric] = { bars, legend };
    }
    const tile = (id) => Number(document.getElementById(id).dataset.value);
    return {
      tiles: {
        packets: tile("t-packets"), bytes: tile("t-bytes"), cpu_ns: tile("t-cpu"), invocations: tile("t-invocations"),
        state_byte_ms: tile("t-state"), state_bytes: tile("t-state-bytes"),
      },
      charts,
      modules: [...document.querySelectorAll("#modules tbody tr[data-name]")].map((r) => r.dataset.name),
      deployments: [...document.querySelectorAll("#deployments tbody tr[data-name]")].map((r) => ({
        name: r.dataset.name, status: r.querySelector(".badge").textContent })),
      bill_total: document.getElementById("bill-total").dataset.value,
      address: location.href,
      signed_in_with: sessionStorage.getItem("sluice-key").slice(0, 3),
      // The usage table's outcome columns, summed over its rows.
      outcomes: Object.fromEntries(["forwarded", "dropped", "rewritten", "policy", "offloaded"].map((o) => [o,
        [...document.querySelectorAll(`#usage-table td[data-outcome="${o}"]`)].reduce((a, td) => a + Number(td.textContent), 0)])),
      events: [...document.querySelectorAll("#events tbody tr.event")].map((r) => r.children[3].textContent),
      logs: [...document.querySelectorAll("#logs tbody tr.log")].map((r) => r.children[5].textContent),
    };
  });
  // SLUICE_DASHBOARD_SCREENSHOT=<file.png> keeps a picture of the page.
  if (process.env.SLUICE_DASHBOARD_SCREENSHOT) {
    await page.screenshot({ path: process.env.SLUICE_DASHBOARD_SCREENSHOT, fullPage: true });
  }
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("#bill-csv")]);
  shown.csv = readFileSync(await download.path(), "utf8");
  shown.csv_name = download.suggestedFilename();
  shown.foreign_requests = foreign;
  shown.page_errors = errors;
  console.log(JSON.stringify(shown));
} finally {
  await browser.close();
}
