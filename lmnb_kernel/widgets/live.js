// Front end of lmnb's live run view (anywidget ESM; no build step).
//
// The Python side renders every part of the view as HTML (the same renderer as the static bundle)
// and keeps the `snapshot` trait ({seq, html}) as the full state. While the cell runs it sends
// custom messages {type: "ops", seq, ops: [{op: "set"|"append", k, html}]} at most 20 per second;
// `k` names an element carrying data-k="<k>". An op frame applies only on top of the frame before
// it (seq + 1); after a gap (a page reloaded mid-run) the view waits for the next snapshot.
// The Stop button sends {action: "stop"}. Frontends that deliver comm messages only after the cell
// finishes (no comms over subshells) never acknowledge it, so after a short wait the button says
// to use Kernel > Interrupt instead.

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "lmnb-live";
  const bar = document.createElement("div");
  bar.style.cssText = "margin:0 0 4px 0;font-size:12px;font-family:sans-serif";
  const stop = document.createElement("button");
  stop.className = "lmnb-stop";
  stop.textContent = "\u25A0 Stop";
  stop.title = "Abort this cell's generation requests";
  stop.style.cssText = "font-size:12px;padding:0 8px;margin-right:6px;cursor:pointer";
  const hint = document.createElement("span");
  hint.className = "lmnb-stop-hint";
  hint.style.color = "#57606a";
  bar.append(stop, hint);
  const body = document.createElement("div");
  root.append(bar, body);
  el.append(root);

  let seq = -1;
  let waiting = false; // an op frame was missed: wait for the next snapshot

  function showSnapshot() {
    const snap = model.get("snapshot") || {};
    body.innerHTML = snap.html || "";
    seq = snap.seq === undefined ? -1 : snap.seq;
    waiting = false;
  }

  function applyOps(ops) {
    for (const op of ops) {
      const target = body.querySelector(`[data-k="${CSS.escape(op.k)}"]`);
      if (!target) return false;
      // a lane scrolled to its end follows new tokens; one the reader scrolled up stays put
      const lane = target.closest(".lmnb-lane-body");
      const follow = lane && lane.scrollHeight - lane.scrollTop - lane.clientHeight < 24;
      if (op.op === "set") target.innerHTML = op.html;
      else target.insertAdjacentHTML("beforeend", op.html);
      if (follow) lane.scrollTop = lane.scrollHeight;
    }
    return true;
  }

  function onCustom(msg) {
    if (!msg || msg.type !== "ops" || waiting || msg.seq <= seq) return;
    if (msg.seq !== seq + 1 || !applyOps(msg.ops)) {
      waiting = true;
      return;
    }
    seq = msg.seq;
  }

  function showStatus() {
    const status = model.get("status");
    const running = status === "running" || status === "stopping";
    stop.style.display = running ? "" : "none";
    root.dataset.status = status;
    if (status === "stopping") {
      stop.disabled = true;
      stop.textContent = "Stopping\u2026";
      hint.textContent = "";
    }
  }

  stop.addEventListener("click", () => {
    model.send({ action: "stop" });
    stop.disabled = true;
    stop.textContent = "Stop requested\u2026";
    setTimeout(() => {
      if (model.get("status") === "running") {
        hint.textContent =
          "This frontend delivers widget messages only after the cell ends; use Kernel \u25B8 Interrupt to stop now.";
      }
    }, 2500);
  });

  model.on("change:snapshot", showSnapshot);
  model.on("change:status", showStatus);
  model.on("msg:custom", onCustom);
  showSnapshot();
  showStatus();
  return () => {
    model.off("change:snapshot", showSnapshot);
    model.off("change:status", showStatus);
    model.off("msg:custom", onCustom);
  };
}

export default { render };
