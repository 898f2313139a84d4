// The volunteer page: starts the training Web Worker and shows what it and the swarm do.
// Training runs in worker.js, so this page stays responsive.

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const autostart = params.get("autostart") !== "0";
// Wire format: answers in int2 (three levels of each 64 values' largest) and weights in int8
// by default (docs/BENCHMARKS.md, "int2 answers"); ?compression=int4 for int4 answers,
// int8 for int8 both ways, f16 for half floats, none for exact f32.
const compression = params.get("compression") ?? "int2";
// An invitation link carries the run's join token in the fragment (#token=SECRET), which
// browsers never send to the server in a request.
const joinToken = new URLSearchParams(location.hash.slice(1)).get("token");
// Same origin as the page: wss behind https, ws otherwise.
const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;

const LABELS = {
  starting: "starting…",
  loading: "loading the worker…",
  connecting: "connecting…",
  connected: "connected, waiting for the next round",
  training: "training",
  disconnected: "coordinator unreachable, retrying",
  paused: "paused",
  error: "error",
  finished: "training finished, thank you!",
};

// Tokens a sample holds (a language model's context), else 0: the rate is in samples.
let tokensPerSample = 0;

// The worker's identity survives a reload of this tab (not a new tab: sessionStorage).
const TOKEN_KEY = "crowdtrain.resumeToken";
// The CPU share this volunteer lends, remembered across visits (localStorage).
const CPU_KEY = "crowdtrain.cpu";
const cpu = ["25", "50", "100"].includes(localStorage.getItem(CPU_KEY)) ? localStorage.getItem(CPU_KEY) : "100";
$("cpu").value = cpu;
$("cpu").onchange = () => {
  localStorage.setItem(CPU_KEY, $("cpu").value);
  worker.postMessage({ cmd: "cpu", percent: Number($("cpu").value) });
};
// The cores this volunteer lends (1 up to what the browser reports), remembered too;
// ?cores=N overrides. Half of them by default, so the computer stays responsive.
const CORES_KEY = "crowdtrain.cores";
const maxCores = navigator.hardwareConcurrency || 1;
const cores = Math.min(params.has("cores") ? 64 : maxCores,
  Math.max(1, Number(params.get("cores") ?? localStorage.getItem(CORES_KEY) ?? Math.floor(maxCores / 2)) || 1));
for (let k = 1; k <= Math.max(maxCores, cores); k++) {
  $("cores").add(new Option(`${k} of ${maxCores}`, String(k), false, k === cores));
}
$("cores").onchange = () => {
  localStorage.setItem(CORES_KEY, $("cores").value);
  worker.postMessage({ cmd: "cores", cores: Number($("cores").value) });
};
// The GPU: a real one when the browser has one ("auto"), a software (fallback) adapter
// too ("fallback": tests), or none; remembered, ?gpu= overrides.
const GPU_KEY = "crowdtrain.gpu";
const GPU_CHOICES = ["auto", "fallback", "off"];
const gpu = [params.get("gpu"), localStorage.getItem(GPU_KEY)].find((v) => GPU_CHOICES.includes(v)) ?? "auto";
$("gpu").value = gpu;
$("gpu").onchange = () => {
  localStorage.setItem(GPU_KEY, $("gpu").value);
  worker.postMessage({ cmd: "gpu", gpu: $("gpu").value });
};
// What the tab computes on: its GPU while it has one and it is the faster (`gpuUsed`), else
// its cores.
let onGpu = null;
let gpuUsed = true;
function showDevice() {
  const device = $("device");
  if (onGpu && gpuUsed) {
    device.dataset.device = "gpu";
    device.textContent = `GPU: ${onGpu}`;
    return;
  }
  device.dataset.device = "cpu";
  const lent = Number(device.dataset.cores);
  const used = Number(device.dataset.used ?? lent);
  const slower = onGpu ? `; the GPU (${onGpu}) is slower for this model` : "";
  device.textContent = used < lent
    ? `CPU, 1 core of the ${lent} lent: faster for this model (wasm SIMD)${slower}`
    : `CPU, ${lent} ${lent === 1 ? "core" : "cores"} (wasm SIMD)${slower}`;
}
let workerId = null;
let running = false;
// The page's query goes to the Web Worker: ?relaxed=0 keeps the build without relaxed SIMD.
const worker = new Worker(new URL(`./worker.js${location.search}`, import.meta.url), {
  type: "module",
});

// A browser never tells a page why its WebSocket was refused: ask the coordinator what it
// would answer this page (origin, connections from this address, shutting down).
let asked = null;
async function whyRefused() {
  try {
    const res = await fetch(`/api/join-check?origin=${encodeURIComponent(location.origin)}`, { cache: "no-store" });
    if (res.ok) return null;
    return `the coordinator refused the connection: ${(await res.text()).trim()}`;
  } catch {
    return `the coordinator at ${location.host} cannot be reached`;
  }
}

worker.onmessage = ({ data: e }) => {
  if (e.state === "cores") {
    $("device").dataset.cores = e.cores;
    delete $("device").dataset.used;
    showDevice();
    return;
  }
  if (e.state === "device") {
    // "GPU: <adapter>", or "CPU: <why not the GPU>".
    onGpu = e.device.startsWith("GPU: ") ? e.device.slice(5) : null;
    gpuUsed = true;
    $("device").dataset.why = onGpu ? "" : e.device.replace(/^CPU: /, "");
    showDevice();
    return;
  }
  if (e.coresUsed != null) {
    $("device").dataset.used = e.coresUsed;
    if (e.gpuUsed != null) gpuUsed = e.gpuUsed;
    showDevice();
  }
  if (e.resumeToken) sessionStorage.setItem(TOKEN_KEY, e.resumeToken);
  if (e.helperParts != null) {
    $("device").dataset.helped = e.helperParts;
    $("device").dataset.missed = e.helperMisses;
    // And why not the GPU, where there is a reason to give (no WebGPU, a fallback only, a
    // failure).
    const why = $("device").dataset.why;
    $("device").title = (why ? `not on the GPU: ${why}; ` : "") +
      `parts of batches computed by this tab's other cores: ${e.helperParts}` +
      (e.helperMisses ? `; ${e.helperMisses} recomputed here after a helper failed` : "");
  }
  const state = $("state");
  state.dataset.state = e.state;
  state.textContent = LABELS[e.state] ?? e.state;
  running = !["paused", "error", "finished"].includes(e.state);
  const toggle = $("toggle");
  toggle.disabled = ["error", "loading", "finished"].includes(e.state);
  toggle.textContent = running ? "Pause" : "Resume";
  if (e.round != null) $("round").textContent = e.round;
  if (e.gradients != null) $("gradients").textContent = e.gradients;
  if (e.loss != null) $("loss").textContent = e.loss.toFixed(4);
  // A language model's sample is a window of `context` positions, each a token predicted.
  if (e.samplesPerSec) {
    const rate = e.samplesPerSec * (tokensPerSample || 1);
    $("rate").textContent = Math.round(rate).toLocaleString();
    // A core's share: over the cores the latest batches were computed on; none on a GPU.
    const device = $("device").dataset;
    const used = Number(device.used ?? device.cores);
    $("rate-core").textContent = onGpu && gpuUsed || !(used > 0) ? "–" : Math.round(rate / used).toLocaleString();
  }
  if (e.computeShare != null) $("computing").textContent = `${(e.computeShare * 100).toFixed(e.computeShare < 0.1 ? 1 : 0)} % of the time`;
  if (e.workerId != null) { $("worker-id").textContent = e.workerId; workerId = e.workerId; }
  if (e.state === "disconnected") {
    const retry = `retrying in ${(e.retryInMs / 1000).toFixed(1)} s`;
    $("message").textContent = `${e.message ?? "disconnected"}; ${retry}`;
    if (e.refused) {
      const ask = (asked = whyRefused());
      ask.then((why) => {
        if (why && asked === ask && $("state").dataset.state === "disconnected") {
          $("message").textContent = `${why}; ${retry}`;
        }
      });
    }
  } else if (e.message) {
    $("message").textContent = e.message;
  } else if (e.state === "training") {
    $("message").textContent = "";
  }
};
worker.onerror = async (e) => {
  $("state").dataset.state = "error";
  $("state").textContent = "error";
  let why = e.message;
  if (!why) {
    // The worker's own script did not load: say what the coordinator answered for it.
    why = await fetch("./worker.js", { cache: "no-store" })
      .then((r) => (r.ok ? "its script failed to start" : `worker.js: HTTP ${r.status}`))
      .catch(() => `the coordinator at ${location.host} cannot be reached`);
  }
  $("message").textContent = `the worker failed to start: ${why}`;
};

$("toggle").onclick = () => worker.postMessage({ cmd: running ? "stop" : "start" });
worker.postMessage({
  cmd: "init",
  url: wsUrl,
  autostart,
  compression,
  resumeToken: sessionStorage.getItem(TOKEN_KEY),
  joinToken,
  cpu: Number(cpu),
  cores,
  gpu,
  // ?pin=1: every core lent on every batch, even where one core is faster (tests).
  pinCores: params.get("pin") === "1",
});

// A hidden tab keeps training in its Web Worker, but browsers may slow it down: say so.
let hiddenAt = null;
document.addEventListener("visibilitychange", () => {
  if (document.hidden) {
    hiddenAt = { at: Date.now(), gradients: Number($("gradients").textContent) };
  } else if (hiddenAt) {
    const secs = Math.round((Date.now() - hiddenAt.at) / 1000);
    const done = Number($("gradients").textContent) - hiddenAt.gradients;
    $("message").textContent = done > 0
      ? `while this tab was in the background (${secs} s) it kept training: ${done} gradients`
      : `this tab was in the background for ${secs} s and the browser throttled it: no gradients`;
    hiddenAt = null;
  }
});

// The swarm's accuracy (a language model's: its validation loss), one point per evaluation
// of the whole run: the coordinator's history when the page opens, then each new one.
const curve = [];
let language = null; // a language model's readings, from the status
function drawCurve() {
  const svg = $("curve");
  svg.dataset.points = curve.length;
  svg.dataset.first = curve.length ? curve[0][0] : "";
  if (curve.length < 2) return;
  if (curve.length > 400) curve.splice(0, curve.length, ...curve.filter((_, i) => i % 2 === 0 || i === curve.length - 1));
  const [x0, x1] = [curve[0][0], curve[curve.length - 1][0]];
  const ys = curve.map((p) => p[1]);
  // Accuracy on 0-1; a loss from 0 to its highest.
  const top = language ? Math.max(...ys) || 1 : 1;
  const X = (x) => 4 + ((x - x0) / (x1 - x0 || 1)) * 292;
  // The line keeps below the label's band (y < 16) and above the rounds' (y > 66).
  const Y = (y) => 64 - (y / top) * 46;
  const last = ys[ys.length - 1];
  const label = language ? `validation loss ${last.toFixed(3)}` : `${(last * 100).toFixed(1)} %`;
  svg.innerHTML = `<polyline points="${curve.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(" ")}"/>` +
    `<text x="4" y="78">round ${x0}</text><text x="296" y="78" text-anchor="end">round ${x1}</text>` +
    `<text x="4" y="10">${label}</text>`;
}
let historyLoaded = false;
async function loadHistory() {
  historyLoaded = true;
  try {
    const points = await (await fetch("/api/history", { cache: "no-store" })).json();
    const evaluated = points.filter((p) => (language ? p.test_loss : p.test_accuracy) != null)
      .map((p) => [p.round, language ? p.test_loss : p.test_accuracy]);
    const newer = curve.filter((p) => !evaluated.length || p[0] > evaluated[evaluated.length - 1][0]);
    curve.splice(0, curve.length, ...evaluated, ...newer);
    drawCurve();
  } catch { historyLoaded = false; }
}

let edgeUrls = wsUrl;
async function pollSwarm() {
  try {
    const res = await fetch("/api/status", { cache: "no-store" });
    const s = await res.json();
    language = s.language;
    if (s.language) {
      const l = s.language;
      $("accuracy-label").textContent = "Validation loss";
      $("accuracy").textContent = `${s.test_loss.toFixed(3)} (perplexity ${l.perplexity.toFixed(2)}, ${l.bits_per_token.toFixed(2)} bits per ${l.unit})`;
    } else {
      $("accuracy").textContent = s.test_accuracy == null ? "not evaluated yet" : `${(s.test_accuracy * 100).toFixed(1)} %`;
    }
    const context = /; gpt .*context (\d+)/.exec(s.model);
    tokensPerSample = context ? Number(context[1]) : 0;
    $("rate-label").textContent = tokensPerSample ? "Tokens / s" : "Samples / s";
    $("rate-core-label").textContent = tokensPerSample ? "Tokens / s a core" : "Samples / s a core";
    $("sample-card").hidden = !s.sample;
    if (s.sample) {
      $("sample-round").textContent = `after round ${s.sample.round}`;
      $("sample-prompt").textContent = s.sample.prompt;
      $("sample-text").textContent = s.sample.text;
    }
    if (!historyLoaded && s.evaluated_round != null) loadHistory();
    $("workers").textContent = s.workers;
    $("model").textContent = `${s.model_name}, ${s.param_count.toLocaleString()} parameters`;
    $("model").title = s.model;
    $("dataset").textContent = s.dataset;
    $("swarm-round").textContent = s.round;
    const y = s.language ? s.test_loss : s.test_accuracy;
    if (y != null && s.evaluated_round != null &&
        (!curve.length || curve[curve.length - 1][0] < s.evaluated_round)) {
      curve.push([s.evaluated_round, y]);
      drawCurve();
    }
    // A cluster's edge: the other edges too, so that the worker moves on if this one dies.
    if (s.cluster) {
      const urls = [wsUrl, ...s.cluster.edges.map((e) => e.url).filter((u) => u !== wsUrl)];
      if (urls.join(",") !== edgeUrls) {
        edgeUrls = urls.join(",");
        worker.postMessage({ cmd: "urls", urls });
      }
      $("edges-row").hidden = false;
      $("edges").dataset.count = urls.length;
      $("edges").textContent = `${urls.length}: this tab moves to another if this one goes away`;
    }
    const mine = s.worker_list.find((w) => w.id === workerId);
    if (mine && s.gradients_accepted > 0) {
      $("share").textContent = `${((mine.gradients / s.gradients_accepted) * 100).toFixed(1)} % of the gradients`;
    }
  } catch {
    $("accuracy").textContent = "coordinator unreachable";
  }
}
pollSwarm();
setInterval(pollSwarm, 2000);
