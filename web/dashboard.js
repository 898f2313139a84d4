// The operator's dashboard: the coordinator pushes the run's history, then its status, over
// Server-Sent Events (/api/events); this page keeps the whole run (the coordinator's history
// is downsampled, and so is what this page adds to it) and draws small SVG line charts of it,
// or of the recent rounds only, as the operator chooses.
// Admin controls call the admin API with the token kept in sessionStorage.

const $ = (id) => document.getElementById(id);
const KEEP = 2000; // points per chart, at most: older ones are thinned to every other
const RECENT = 500; // the newest points, never thinned
const series = { loss: [], accuracy: [], workers: [], duration: [], gradients: [], bytes: [] };
const durations = []; // recent round durations, for p50 / p95
let prev = null; // the previous point: per-round and per-second differences

const pct = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
// Adds a point; a full chart keeps every other of its older points (the whole run, at half
// the resolution), and its newest RECENT as they are.
const push = (list, point) => {
  list.push(point);
  if (list.length > KEEP) {
    const old = list.length - RECENT;
    const kept = list.filter((_, i) => i >= old || i % 2 === 0);
    list.splice(0, list.length, ...kept);
  }
};
// "all": the whole run; a number: the last that many rounds.
let shown = "all";

// One point of the run (from /api/events' history, or made from a live status): the charts
// take what changed since the previous one.
function addPoint(p) {
  if (prev && p.round <= prev.round) return;
  const r = p.round;
  push(series.loss, [r, [p.train_loss]]);
  if (p.test_accuracy != null && p.evaluated_round != null) {
    const a = series.accuracy;
    // A language model's chart is its validation loss; a classifier's, its accuracy.
    const y = languageModel ? p.test_loss : p.test_accuracy * 100;
    if (y != null && (!a.length || a[a.length - 1][0] !== p.evaluated_round)) push(a, [p.evaluated_round, [y]]);
  }
  push(series.workers, [r, [p.workers, p.participants, p.skipped]]);
  durations.push(p.round_ms);
  if (durations.length > 20) durations.shift();
  const sorted = [...durations].sort((x, y) => x - y);
  push(series.duration, [r, [pct(sorted, 0.5), pct(sorted, 0.95)]]);
  if (prev) {
    const rounds = r - prev.round;
    const per = (key) => (p[key] - prev[key]) / rounds;
    const other = per("gradients_rejected") - per("late") - per("stale_rejected") - per("duplicate_rejected");
    push(series.gradients, [r, [per("gradients_accepted"), per("late"), per("stale_rejected") + per("duplicate_rejected"), other]]);
    const secs = (p.unix_ms - prev.unix_ms) / 1000;
    if (secs > 0 && p.bytes_in >= prev.bytes_in) {
      push(series.bytes, [r, [(p.bytes_in - prev.bytes_in) / secs / 1e6, (p.bytes_out - prev.bytes_out) / secs / 1e6]]);
    }
  }
  prev = p;
}

// Charts whose values crowd one end of the scale are drawn zoomed to their data: accuracy
// from 93 % to 96 % is not a flat line at the top of 0-100.
const ZOOMED = new Set(["accuracy"]);

function redraw() {
  for (const [name, points] of Object.entries(series)) {
    const last = points.length ? points[points.length - 1][0] : 0;
    const visible = shown === "all" ? points : points.filter((p) => p[0] > last - Number(shown));
    draw($(`chart-${name}`), visible, ZOOMED.has(name));
  }
}
$("window").onchange = () => { shown = $("window").value; redraw(); };

// Whether the run trains a language model (its status reads the loss as perplexity and bits).
let languageModel = false;
let history = null; // the history, kept until the first status says what the model is

function onHistory(points) {
  history = points;
  redraw();
}

function replay(points) {
  for (const p of points) addPoint({ ...p, evaluated_round: p.test_accuracy == null ? null : p.round });
}

function onStatus(s) {
  if (history) {
    languageModel = s.language != null || /^input \d+; gpt /.test(s.model);
    if (languageModel) $("accuracy-label").firstChild.textContent = "Validation loss, nats per token";
    replay(history);
    history = null;
  }
  $("sample").hidden = !s.sample;
  if (s.sample) {
    $("sample-round").textContent = `round ${s.sample.round}`;
    $("sample-prompt").textContent = s.sample.prompt;
    $("sample-text").textContent = s.sample.text;
  }
  $("state").textContent = s.state;
  $("state").dataset.state = s.state;
  $("run").textContent = `model ${s.model_name}: ${s.model} (${s.param_count.toLocaleString()} parameters) · ` +
    `${s.dataset} · ${s.mode} · aggregator ${s.aggregator} · ${s.optimizer}`;
  $("efficiency").textContent = efficiency(s);
  kept(s);
  if (s.train_loss != null && s.last_round_ms != null) {
    addPoint({
      round: s.round, unix_ms: Date.now(), train_loss: s.train_loss, test_accuracy: s.test_accuracy, test_loss: s.test_loss,
      evaluated_round: s.evaluated_round, workers: s.workers, participants: s.last_round?.answered + s.last_round?.missed,
      skipped: s.skipped_workers, round_ms: s.last_round_ms, gradients_accepted: s.gradients_accepted,
      gradients_rejected: s.gradients_rejected, late: s.late, stale_rejected: s.stale_rejected,
      duplicate_rejected: s.duplicate_rejected, bytes_in: s.bytes_in, bytes_out: s.bytes_out,
    });
  }
  redraw();
  table(s);
  cluster(s);
}

// Where the model is kept, and once the run is finished, how to take it away.
function kept(s) {
  const dir = s.checkpoints?.dir;
  const version = s.checkpoints?.last_version;
  let text = dir ? `checkpoints in ${dir}` + (version != null ? ` (last: version ${version})` : "") : "";
  if (s.state === "done") {
    text = dir
      ? `Training finished. The model is kept in ${dir}: coordinator export --checkpoint-dir ${dir} --out model.safetensors`
      : "Training finished, without checkpoints: its weights are at /api/params until the coordinator stops.";
  }
  $("kept").hidden = !text;
  $("kept").textContent = text;
  $("kept").dataset.state = s.state;
}

// A line chart of `points` ([x, [y0, y1, ...]]) in a 320 × 140 viewBox, from zero, or
// `zoomed` to the data's range. Series after the first are dashed, dotted, dash-dotted, so
// one that equals another still shows; the caption's `.v` spans give each one's latest value.
function draw(svg, points, zoomed = false) {
  const W = 320, H = 140, L = 34, B = 14;
  svg.dataset.points = points.length;
  svg.dataset.first = points.length ? points[0][0] : "";
  legend(svg, points);
  if (points.length < 2) { svg.innerHTML = `<text x="${L}" y="${H / 2}">waiting for rounds…</text>`; return; }
  const xs = points.map((p) => p[0]);
  const ys = points.flatMap((p) => p[1]).filter(Number.isFinite);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(0, ...ys), Math.max(...ys) || 1];
  if (zoomed) {
    const [lo, hi] = [Math.min(...ys), Math.max(...ys)];
    const pad = Math.max((hi - lo) * 0.1, 0.5);
    [y0, y1] = [Math.max(0, lo - pad), hi + pad];
  }
  svg.dataset.yMin = y0;
  svg.dataset.yMax = y1;
  const X = (x) => L + ((x - x0) / (x1 - x0 || 1)) * (W - L - 4);
  const Y = (y) => H - B - ((y - y0) / (y1 - y0 || 1)) * (H - B - 6);
  const lines = points[0][1].map((_, i) =>
    `<polyline class="s${i}" points="${points.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1][i]).toFixed(1)}`).join(" ")}"/>`);
  const fmt = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3));
  svg.innerHTML = `<line class="axis" x1="${L}" y1="${H - B}" x2="${W}" y2="${H - B}"/>` +
    `<line class="axis" x1="${L}" y1="4" x2="${L}" y2="${H - B}"/>` +
    `<text x="0" y="10">${fmt(y1)}</text><text x="0" y="${H - B}">${fmt(y0)}</text>` +
    `<text x="${L}" y="${H - 2}">round ${x0}</text><text x="${W - 60}" y="${H - 2}">round ${x1}</text>` +
    lines.join("");
}

// Each series' latest value, in its caption.
function legend(svg, points) {
  const last = points.length ? points[points.length - 1][1] : [];
  const spans = svg.closest("figure").querySelectorAll("figcaption .v");
  spans.forEach((span, i) => {
    const v = last[i];
    span.textContent = v == null ? "" : ` ${Math.abs(v) >= 100 || Number.isInteger(v) ? v.toFixed(0) : v.toPrecision(3)}`;
  });
}

const percent = (v) => (v == null ? "–" : `${(v * 100).toFixed(v < 0.1 ? 1 : 0)} %`);

// How much of the volunteers' time goes to computing, and what the link carries.
function efficiency(s) {
  const parts = [`workers computing ${percent(s.utilisation)} of their time`];
  if (s.local_steps != null) parts.push(`local steps ${s.local_steps.toFixed(s.local_steps < 10 ? 1 : 0)} per answer`);
  else parts.push("one step per answer");
  if (s.bytes_per_sample != null) parts.push(`${s.bytes_per_sample.toPrecision(3)} bytes per sample`);
  const crowd = crowdFit(s.noise_scale);
  if (crowd) parts.push(crowd);
  const checks = checksLoad(s);
  if (checks) parts.push(checks);
  if (s.language) {
    const l = s.language;
    parts.push(`validation perplexity ${l.perplexity.toFixed(2)}, ${l.bits_per_token.toFixed(3)} bits per ${l.unit}`);
  }
  return parts.join(" · ");
}

// The share of the checks' cores (--verify-cores) spent replaying answers, over the last
// half minute of pushed statuses: the coordinator's own clock, read from recompute_seconds.
// Full: sampled phases are set aside from their rounds (or, the last that could carry one,
// hold it), and past probation answers are sampled at the floor.
const checkTimes = [];
function checksLoad(s) {
  const now = performance.now() / 1e3;
  checkTimes.push([now, s.recompute_seconds]);
  while (checkTimes.length > 2 && now - checkTimes[1][0] >= 30) checkTimes.shift();
  const [t0, r0] = checkTimes[0];
  if (now - t0 < 5 || !(s.verify_cores > 0)) return null;
  const load = Math.max(0, s.recompute_seconds - r0) / ((now - t0) * s.verify_cores);
  const cores = `${s.verify_cores} core${s.verify_cores > 1 ? "s" : ""}`;
  const floored = s.sampling_floored > 0 ? `, ${s.sampling_floored} pulls sampled at the floor` : "";
  const aside = s.sampled_aside > 0 ? `, ${s.sampled_aside} sampled phases set aside` : "";
  if (load < 0.9) return `checks ${percent(load)} of ${cores}${floored}${aside}`;
  return `checks ${percent(load)} of ${cores}: full${aside}${floored} (raise --verify-cores)`;
}

// The gradient noise scale against the crowd's batch: whether more volunteers still help.
// Shown after 5 updates of two answers or more (one is too noisy to read).
function crowdFit(n) {
  if (!n || n.readings < 5) return null;
  const batch = Math.round(n.crowd_batch);
  if (n.samples == null) return `noise drowns the gradient at a crowd batch of ${batch}: more volunteers help`;
  const scale = `gradient noise scale ≈ ${Math.round(n.samples)} samples against a crowd batch of ${batch}`;
  if (n.crowd_batch <= n.samples) return `${scale}: more volunteers help`;
  return `${scale}: the model is too small for its crowd (twice the crowd: at most ${n.doubling_gain.toFixed(2)}× fewer steps)`;
}

const ago = (ms) => (ms == null ? "–" : `${Math.max(0, Math.round((Date.now() - ms) / 1000))} s ago`);

function table(s) {
  const probation = s.on_probation ? `, ${s.on_probation} on probation` : "";
  $("worker-count").textContent = `${s.workers} connected${probation}`;
  const rows = s.worker_list.map((w) => {
    const rejected = Object.entries(w.rejected).map(([k, v]) => `${k} ${v}`).join(", ") || "–";
    const since = w.connected_at_ms ? new Date(w.connected_at_ms).toLocaleTimeString() : "–";
    return `<tr data-worker="${w.id}"><td>${w.id}</td><td>${w.kind}${w.fused ? " · fused" : ""}</td><td>${since}</td><td>${w.gradients}</td>` +
      `<td>${w.samples_per_sec == null ? "–" : Math.round(w.samples_per_sec)}</td>` +
      `<td>${w.local_steps ?? 1}</td><td>${w.cores === 0 ? "GPU" : (w.cores ?? 1)}</td><td>${percent(w.compute_share)}</td><td>${ago(w.last_seen_ms)}</td>` +
      `<td>${w.compression ?? "–"}</td><td>${rejected}</td><td>${w.strikes}</td>` +
      `<td title="every answer of a worker on probation is recomputed before it counts">` +
      `${w.probation_left ? `probation, ${w.probation_left} to go` : "trusted"}</td>` +
      `<td class="admin"><button data-kick="${w.id}">kick</button><button class="danger" data-ban="${w.id}">ban</button></td></tr>`;
  });
  $("workers").tBodies[0].innerHTML = rows.join("");
  $("bans").textContent = s.bans.length ? s.bans.join(", ") : "none";
  $("rejected").textContent = `${s.gradients_rejected} (late ${s.late}, stale ${s.stale_rejected}, duplicate ${s.duplicate_rejected})`;
}

// `--role edge`: every edge of the run, from their leases.
function cluster(s) {
  $("cluster").hidden = !s.cluster;
  if (!s.cluster) return;
  const c = s.cluster;
  const root = c.root_version == null ? "no root yet" : `root at version ${c.root_version}`;
  $("cluster-summary").textContent = `${c.edges.length} edges, ${c.workers} workers in all, ${root}`;
  const esc = (t) => String(t).replace(/[&<>"]/g, (ch) => `&#${ch.charCodeAt(0)};`);
  $("edges").tBodies[0].innerHTML = c.edges
    .map((e) => `<tr><td>${esc(e.name)}</td><td>${esc(e.url)}</td><td>${e.workers}</td><td>${e.version}</td></tr>`)
    .join("");
}

// Admin: the token stays in this tab only.
const TOKEN_KEY = "crowdtrain.adminToken";
const token = () => sessionStorage.getItem(TOKEN_KEY);
const steering = () => document.body.classList.toggle("steering", !!token());
async function admin(action, body) {
  const res = await fetch(`/api/admin/${action}`, {
    method: "POST",
    headers: { Authorization: `Bearer ${token()}`, "Content-Type": "application/json" },
    body: body ? JSON.stringify(body) : "",
  });
  const answer = await res.json().catch(() => ({ error: res.statusText }));
  $("admin-result").textContent = answer.done ?? `refused (${res.status}): ${answer.error}`;
  if (res.status === 401) { sessionStorage.removeItem(TOKEN_KEY); steering(); }
}
$("token-form").onsubmit = (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value);
  $("token").value = "";
  steering();
};
$("lr-form").onsubmit = (e) => { e.preventDefault(); admin("lr", { lr: Number($("lr").value) }); };
document.body.addEventListener("click", (e) => {
  const b = e.target.closest("button");
  if (!b) return;
  if (b.dataset.action === "stop" && !confirm("Stop the run? The coordinator exits after a final checkpoint.")) return;
  if (b.dataset.action) admin(b.dataset.action);
  if (b.dataset.kick) admin("kick", { worker: Number(b.dataset.kick) });
  if (b.dataset.ban && confirm(`Ban worker ${b.dataset.ban} for the rest of the run?`)) admin("ban", { worker: Number(b.dataset.ban) });
});
$("forget").onclick = () => { sessionStorage.removeItem(TOKEN_KEY); steering(); };
steering();

const events = new EventSource("/api/events");
events.addEventListener("history", (e) => onHistory(JSON.parse(e.data)));
events.addEventListener("status", (e) => onStatus(JSON.parse(e.data)));
events.onerror = () => { $("state").textContent = "unreachable, retrying"; $("state").dataset.state = "unreachable"; };
