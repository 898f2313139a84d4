// Web Worker: loads the wasm package and runs the training loop off the page's thread.
// Messages in: {cmd: "init", url, autostart, resumeToken, compression, joinToken, cpu, cores,
// pinCores, gpu} | {cmd: "start"} | {cmd: "stop"} | {cmd: "cpu", percent} | {cmd: "cores", cores} |
// {cmd: "gpu", gpu: "auto" | "fallback" | "off"} | {cmd: "urls", urls}.
// Messages out: the BrowserWorker's events ({state, round, gradients, loss, ...}),
// {state: "cores", cores, helpers} when the cores lent change, and {state: "device",
// device: "GPU: <adapter>" | "CPU: <why not>"} when the GPU is chosen or given up.

postMessage({ state: "loading" });
let BrowserWorker = null;
// Imported here, not at the top: a module that fails to load there gives the page only an
// error event without a reason. The coordinator says why a package file is missing.
const ready = (async () => {
  try {
    // The page's query (?relaxed=0) is this Web Worker's too, and its helpers'.
    const { loadWasm } = await import("./wasm.js");
    const { wasm } = await loadWasm(self.location.search);
    BrowserWorker = wasm.BrowserWorker;
  } catch (err) {
    postMessage({ state: "error", message: await whyNotLoaded(err) });
    throw err;
  }
})();
let worker = null;

// The tab's other cores: helper Web Workers (core.js), each computing parts of batches.
// `compute(index, message)` is what the wasm worker calls (worker-wasm/src/cores.rs); a
// helper that fails rejects, and the wasm worker then computes that part itself.
class Helpers {
  constructor() {
    this.workers = [];
    this.waiting = new Map();
    this.next = 0;
  }

  resize(count) {
    while (this.workers.length < count) {
      // The same query as this Web Worker's, so that a helper loads the same build.
      const helper = new Worker(new URL(`./core.js${self.location.search}`, import.meta.url), {
        type: "module",
      });
      const mine = new Set();
      helper.onmessage = ({ data: m }) => {
        if (m.id == null) return;
        const wait = this.waiting.get(m.id);
        this.waiting.delete(m.id);
        mine.delete(m.id);
        if (!wait) return;
        if (m.error) wait.reject(new Error(m.error));
        else wait.resolve(m);
      };
      helper.onerror = (e) => {
        e.preventDefault();
        for (const id of mine) this.waiting.get(id)?.reject(new Error(e.message || "a helper failed"));
        mine.clear();
      };
      this.workers.push({ helper, mine });
    }
    while (this.workers.length > count) {
      const { helper, mine } = this.workers.pop();
      helper.terminate();
      for (const id of mine) this.waiting.get(id)?.reject(new Error("the helper was stopped"));
    }
  }

  compute(index, message) {
    const slot = this.workers[index];
    if (!slot) return Promise.reject(new Error(`no helper ${index}`));
    const id = ++this.next;
    slot.mine.add(id);
    return new Promise((resolve, reject) => {
      this.waiting.set(id, { resolve, reject });
      slot.helper.postMessage({ id, ...message }, message.transfer ?? []);
    });
  }
}
const helpers = new Helpers();

// The page offers 1 up to navigator.hardwareConcurrency; ?cores=N may ask for more (tests).
// `pinned`: always all of them, without timing which is faster (tests, benchmarks).
let pinned = false;
function setCores(cores) {
  const k = Math.max(1, Math.min(Number(cores) || 1, 64));
  helpers.resize(k - 1);
  worker?.set_cores(k, helpers, pinned);
  postMessage({ state: "cores", cores: k, helpers: k - 1 });
}

// A real GPU ("auto"), a fallback (software) adapter too ("fallback"), or none ("off").
async function setGpu(choice) {
  if (!worker) return;
  if (choice === "off") {
    worker.stop_gpu();
    postMessage({ state: "device", device: "CPU: the volunteer chose not to use the GPU" });
    return;
  }
  postMessage({ state: "device", device: await worker.use_gpu(choice === "fallback") });
}

async function whyNotLoaded(err) {
  for (const file of ["./pkg/worker_wasm.js", "./pkg/worker_wasm_bg.wasm"]) {
    try {
      const res = await fetch(file, { method: "HEAD", cache: "no-store" });
      if (!res.ok) {
        const said = (await fetch(file, { cache: "no-store" }).then((r) => r.text())).trim();
        return `the training code is not on this coordinator (${file.slice(2)}: HTTP ${res.status}): ${said}`;
      }
    } catch {
      return "the coordinator cannot be reached to load the training code";
    }
  }
  return `could not load the wasm worker: ${err}`;
}

onmessage = async ({ data: msg }) => {
  await ready;
  switch (msg.cmd) {
    case "init":
      worker = new BrowserWorker(
        msg.url,
        (event) => postMessage(event),
        msg.resumeToken ?? undefined,
        msg.compression ?? undefined,
        msg.joinToken ?? undefined,
      );
      if (msg.cpu) worker.set_cpu(msg.cpu);
      pinned = Boolean(msg.pinCores);
      setCores(msg.cores ?? 1);
      // Before the first batch, so that it is computed where the volunteer chose.
      await setGpu(msg.gpu ?? "auto");
      if (msg.autostart) worker.start();
      else postMessage({ state: "paused" });
      break;
    case "start":
      worker?.start();
      break;
    case "stop":
      worker?.stop();
      break;
    case "cpu":
      worker?.set_cpu(msg.percent);
      break;
    case "cores":
      setCores(msg.cores);
      break;
    case "gpu":
      await setGpu(msg.gpu);
      break;
    case "urls":
      worker?.set_urls(msg.urls.join(","));
      break;
  }
};
