// Drives JupyterLab in Debian's chromium through playwright-core and reports what the DOM shows.
//
// Usage: node lab_driver.js <config.json>
//   config: {base, token, notebook, untrusted, artifacts, cells: {fork, cont, stop, tree}}
//   (cell indices in `notebook`; `untrusted` is a notebook with saved static outputs only).
// Prints one JSON object (the observations) as the last stdout line; the pytest side asserts.
// Writes "lab_driver step: NAME" to stderr as it begins each step (the pytest side names the step
// it was in where the driver runs past its time), and an error says its step too.
// Recipe: research notes jupyter.md §4.5 (JupyterLab's window.jupyterapp, execution state).

const fs = require("fs");
const path = require("path");
const { chromium } = require("playwright-core");

const cfg = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const shot = (name) => path.join(cfg.artifacts, name);
const out = { errors: [], console_errors: [] };
let current = "";

function step(name) {
  current = name;
  console.error(`lab_driver step: ${name}`);
}

async function openNotebook(page, name) {
  await page.goto(`${cfg.base}/lab/tree/${name}?token=${cfg.token}&reset`);
  await page.waitForSelector(".jp-NotebookPanel .jp-Notebook .jp-Cell", { timeout: 90000 });
}

async function waitKernelIdle(page) {
  await page.waitForFunction(() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return k && k.status === "idle";
  }, null, { timeout: 90000, polling: 200 });
}

// Start running cell i without waiting for it to finish (so the live view can be observed).
async function startCell(page, i) {
  await page.evaluate((index) => {
    const app = window.jupyterapp;
    app.shell.currentWidget.content.activeCellIndex = index;
    app.commands.execute("notebook:run-cell");
  }, i);
}

const cellOutput = (page, i) => page.locator(".jp-Notebook .jp-Cell").nth(i).locator(".jp-OutputArea-output");

async function bg(locator) {
  return locator.evaluate((el) => getComputedStyle(el).backgroundColor);
}

(async () => {
  step("launching chromium");
  const browser = await chromium.launch({
    executablePath: cfg.chromium || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    page.on("console", (m) => { if (m.type() === "error") out.console_errors.push(m.text()); });
    step("opening the notebook");
    await openNotebook(page, cfg.notebook);
    await waitKernelIdle(page);

    // 1. a fork cell keeping state s: its output ends as the static view with lanes and the join
    step("1. the fork cell");
    await startCell(page, cfg.cells.fork);
    const fork = cellOutput(page, cfg.cells.fork);
    await fork.locator(".lmnb-run.lmnb-done").waitFor({ timeout: 90000 });
    out.fork_static_lanes = await fork.locator(".lmnb-run.lmnb-done td.lmnb-lane").count();
    out.fork_live_left = await fork.locator(".lmnb-live").count();
    out.fork_lane_texts = await fork.locator("td.lmnb-lane .lmnb-lane-body").allTextContents();
    out.fork_join = await fork.locator(".lmnb-join").allTextContents();
    await fork.locator(".lmnb-run").first().screenshot({ path: shot("fork-static.png") });

    // 2. a cell continuing state s: the cached span is shaded differently from the computed one
    step("2. the cell continuing state s");
    await waitKernelIdle(page);
    await startCell(page, cfg.cells.cont);
    const cont = cellOutput(page, cfg.cells.cont);
    await cont.locator(".lmnb-run.lmnb-done").waitFor({ timeout: 90000 });
    out.cont_cached = await cont.locator(".lmnb-cached").allTextContents();
    out.cont_computed = await cont.locator(".lmnb-computed").allTextContents();
    out.cont_cached_bg = await bg(cont.locator(".lmnb-cached").first());
    out.cont_computed_bg = await bg(cont.locator(".lmnb-computed").first());
    await cont.locator(".lmnb-run").first().screenshot({ path: shot("continue-state.png") });

    // 3. the radix tree
    step("3. the radix tree cell");
    await waitKernelIdle(page);
    await startCell(page, cfg.cells.tree);
    const tree = cellOutput(page, cfg.cells.tree);
    await tree.locator(".lmnb-tree").waitFor({ timeout: 90000 });
    out.tree_nodes = await tree.locator(".lmnb-node").count();

    // 4. live fork lanes streaming at once, then the Stop button (comms over subshells, Lab >= 4.4)
    step("4. the live fork lanes and the Stop button");
    await waitKernelIdle(page);
    await startCell(page, cfg.cells.stop);
    const stop = cellOutput(page, cfg.cells.stop);
    await page.waitForFunction((i) => {
      const cell = document.querySelectorAll(".jp-Notebook .jp-Cell")[i];
      const bodies = cell ? cell.querySelectorAll(".lmnb-live td.lmnb-lane .lmnb-lane-body") : [];
      return bodies.length === 2 && [...bodies].every((b) => b.querySelectorAll(".lmnb-tok").length >= 3);
    }, cfg.cells.stop, { timeout: 90000, polling: 50 });
    out.live_lanes = await stop.locator(".lmnb-live td.lmnb-lane").count();
    out.live_tokens_mid_run = await stop.locator(".lmnb-live .lmnb-tok").count();
    out.live_status = await stop.locator(".lmnb-live").getAttribute("data-status");
    await stop.locator(".lmnb-live").first().screenshot({ path: shot("fork-live.png") });
    await stop.locator("button.lmnb-stop").click();
    await stop.locator(".lmnb-run.lmnb-interrupted, .lmnb-run.lmnb-done").first().waitFor({ timeout: 90000 });
    out.stop_final = (await stop.locator(".lmnb-run").first().getAttribute("class")).split(/\s+/);
    await stop.locator(".lmnb-run").first().screenshot({ path: shot("stop.png") });

    // 5. %lm flush: the tree shown by cell 3 is refreshed in place, evicted nodes faded
    step("5. %lm flush");
    await waitKernelIdle(page);
    await startCell(page, cfg.cells.flush);
    await tree.locator(".lmnb-node.lmnb-evicted").first().waitFor({ timeout: 60000 });
    out.tree_evicted = await tree.locator(".lmnb-node.lmnb-evicted").count();
    out.tree_evicted_opacity = await tree.locator(".lmnb-node.lmnb-evicted").first()
      .evaluate((el) => getComputedStyle(el).opacity);
    await tree.locator(".lmnb-tree").first().screenshot({ path: shot("tree.png") });

    // 6. a cell that ends within milliseconds: its widget is replaced before the frontend built it
    step("6. the cell that ends at once");
    await waitKernelIdle(page);
    await startCell(page, cfg.cells.fast);
    await cellOutput(page, cfg.cells.fast).locator(".lmnb-run.lmnb-done").waitFor({ timeout: 60000 });
    await waitKernelIdle(page);
    await page.waitForTimeout(1000);

    out.widget_errors = await page.getByText("Error displaying widget").count();
    await page.screenshot({ path: shot("lab.png"), fullPage: true });

    // 7. a saved notebook opened untrusted: JupyterLab sanitizes the static HTML; the view survives
    step("7. the untrusted saved notebook");
    const page2 = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    await openNotebook(page2, cfg.untrusted);
    const run = page2.locator(".jp-OutputArea-output .lmnb-run").first();
    await run.waitFor({ timeout: 60000 });
    out.untrusted_lanes = await page2.locator(".jp-OutputArea-output td.lmnb-lane").count();
    out.untrusted_cached_bg = await bg(page2.locator(".jp-OutputArea-output .lmnb-cached").first());
    out.untrusted_trusted_flag = await page2.evaluate(() =>
      window.jupyterapp.shell.currentWidget.content.model.cells.get(0).trusted);
    await page2.screenshot({ path: shot("untrusted.png"), fullPage: true });
  } catch (e) {
    out.errors.push(`in step ${current}: ${String(e && e.stack ? e.stack : e)}`);
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(out));
})();
