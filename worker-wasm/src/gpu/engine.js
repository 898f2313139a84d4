// crowdtrain's GPU path, the WebGPU side: finds an adapter, and runs a plan
// (worker-wasm/src/gpu/plan.rs) of the kernels in kernels.wgsl for a batch. Rust decides
// what to compute; this file only moves buffers and launches kernels.

// Adapters that compute on the CPU: used only when asked (they are slower than the CPU
// path itself).
const SOFTWARE = /swiftshader|llvmpipe|lavapipe|softpipe|warp|microsoft basic render/i;

// How long a driver may take to hand out a device, and to compute a batch, before the tab
// gives the GPU up and computes on its CPU (a hung driver must not stop a volunteer's tab).
const OPEN_MS = 10_000;
const RUN_MS = 60_000;

function within(ms, what, promise) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not answer in ${ms / 1000} s`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

function describe(adapter) {
  const info = adapter.info || {};
  const name = [info.vendor, info.architecture, info.device, info.description]
    .filter((part) => part)
    .join(" ");
  const fallback =
    info.isFallbackAdapter === true || adapter.isFallbackAdapter === true || SOFTWARE.test(name);
  return { name: name || "unnamed adapter", fallback };
}

// The device to compute on, or why there is none: {device, name, fallback} | {none}.
export function openGpu(allowFallback) {
  const opening = open(allowFallback);
  return within(OPEN_MS, "the GPU", opening).catch((err) => {
    // A device that arrives after all is given back.
    opening.then((got) => got.device?.destroy(), () => {});
    throw err;
  });
}

async function open(allowFallback) {
  if (typeof navigator === "undefined" || !navigator.gpu) {
    return { none: "this browser has no WebGPU" };
  }
  let adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter && allowFallback) {
    adapter = await navigator.gpu.requestAdapter({ forceFallbackAdapter: true });
  }
  if (!adapter) return { none: "no WebGPU adapter" };
  const { name, fallback } = describe(adapter);
  if (fallback && !allowFallback) {
    return { none: `only a fallback adapter (${name}), which computes on the CPU` };
  }
  const limits = adapter.limits;
  const device = await adapter.requestDevice({
    requiredLimits: {
      maxStorageBufferBindingSize: limits.maxStorageBufferBindingSize,
      maxBufferSize: limits.maxBufferSize,
    },
  });
  return { device, name, fallback };
}

const STORAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;

export class Engine {
  constructor(device, code) {
    this.device = device;
    this.module = device.createShaderModule({ code });
    const entries = [{ binding: 0, visibility: GPUShaderStage.COMPUTE, buffer: { type: "uniform" } }];
    for (let binding = 1; binding <= 7; binding++) {
      entries.push({ binding, visibility: GPUShaderStage.COMPUTE, buffer: { type: "storage" } });
    }
    this.layout = device.createBindGroupLayout({ entries });
    this.pipelineLayout = device.createPipelineLayout({ bindGroupLayouts: [this.layout] });
    this.pipelines = new Map();
    this.lost = null;
    device.lost.then((info) => {
      this.lost = info.message || info.reason || "the GPU device was lost";
    });
  }

  // Resolves if the kernels compiled, rejects with the compiler's messages otherwise.
  async check() {
    const info = await this.module.getCompilationInfo();
    const errors = info.messages.filter((m) => m.type === "error");
    if (errors.length) {
      throw new Error(errors.map((m) => `${m.lineNum}:${m.linePos} ${m.message}`).join("; "));
    }
  }

  pipeline(kernel) {
    let pipeline = this.pipelines.get(kernel);
    if (!pipeline) {
      pipeline = this.device.createComputePipeline({
        layout: this.pipelineLayout,
        compute: { module: this.module, entryPoint: kernel },
      });
      this.pipelines.set(kernel, pipeline);
    }
    return pipeline;
  }

  // A plan's buffers and bind groups: {rows, labels, params, acts, masks, kernels: [name],
  // uniforms: Uint32Array (16 a dispatch), groups: Uint32Array (x, y a dispatch)}.
  prepare(plan) {
    const d = this.device;
    const size = (values) => Math.max(4, values * 4);
    const buffer = (values, usage = STORAGE()) => d.createBuffer({ size: size(values), usage });
    const b = {
      w: buffer(plan.params),
      g: buffer(plan.params),
      act: buffer(plan.acts),
      dact: buffer(plan.acts),
      mask: buffer(plan.masks),
      lab: buffer(plan.labels),
      loss: buffer(plan.rows),
      gRead: buffer(plan.params, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST),
      lossRead: buffer(plan.rows, GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST),
    };
    const count = plan.kernels.length;
    const uniforms = d.createBuffer({
      size: Math.max(256, count * 256),
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    });
    const dispatches = [];
    for (let i = 0; i < count; i++) {
      d.queue.writeBuffer(uniforms, i * 256, plan.uniforms, i * 16, 16);
      const group = d.createBindGroup({
        layout: this.layout,
        entries: [
          { binding: 0, resource: { buffer: uniforms, offset: i * 256, size: 64 } },
          ...[b.w, b.g, b.act, b.dact, b.mask, b.lab, b.loss].map((buf, j) => ({
            binding: j + 1,
            resource: { buffer: buf },
          })),
        ],
      });
      dispatches.push({
        pipeline: this.pipeline(plan.kernels[i]),
        group,
        x: plan.groups[2 * i],
        y: plan.groups[2 * i + 1],
      });
    }
    return { plan, buffers: b, uniforms, dispatches };
  }

  // Runs a prepared plan on a batch: resolves to {loss: Float32Array (a row's each),
  // grads: Float32Array (full layout)}, or rejects with the GPU's error. The arrays are
  // copied before the first await (they may be views of wasm memory).
  async run(prepared, weights, x, labels, masks) {
    if (this.lost) throw new Error(this.lost);
    const d = this.device;
    const { buffers: b, plan } = prepared;
    d.pushErrorScope("out-of-memory");
    d.pushErrorScope("validation");
    d.queue.writeBuffer(b.w, 0, weights);
    if (x.length) d.queue.writeBuffer(b.act, 0, x);
    d.queue.writeBuffer(b.lab, 0, labels);
    if (masks.length) d.queue.writeBuffer(b.mask, 0, masks);
    const encoder = d.createCommandEncoder();
    const pass = encoder.beginComputePass();
    for (const { pipeline, group, x: gx, y: gy } of prepared.dispatches) {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(gx, gy);
    }
    pass.end();
    encoder.copyBufferToBuffer(b.g, 0, b.gRead, 0, plan.params * 4);
    encoder.copyBufferToBuffer(b.loss, 0, b.lossRead, 0, plan.rows * 4);
    d.queue.submit([encoder.finish()]);
    const [validation, memory] = [await d.popErrorScope(), await d.popErrorScope()];
    const error = validation || memory;
    if (error) throw new Error(error.message);
    await within(
      RUN_MS,
      "the GPU",
      Promise.all([b.gRead.mapAsync(GPUMapMode.READ), b.lossRead.mapAsync(GPUMapMode.READ)]),
    );
    try {
      const grads = new Float32Array(b.gRead.getMappedRange(0, plan.params * 4).slice(0));
      const loss = new Float32Array(b.lossRead.getMappedRange(0, plan.rows * 4).slice(0));
      return { grads, loss };
    } finally {
      b.gRead.unmap();
      b.lossRead.unmap();
    }
  }

  // Each kernel's milliseconds, summed over its dispatches, running them one at a time on
  // the buffers as the last run left them (a profile: `tests/speed.rs`; what a batch takes
  // is `run`'s, whose dispatches share one submission).
  async kernelTimes(prepared) {
    const d = this.device;
    const times = {};
    for (let i = 0; i < prepared.dispatches.length; i++) {
      const { pipeline, group, x: gx, y: gy } = prepared.dispatches[i];
      const encoder = d.createCommandEncoder();
      const pass = encoder.beginComputePass();
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(gx, gy);
      pass.end();
      const started = performance.now();
      d.queue.submit([encoder.finish()]);
      await d.queue.onSubmittedWorkDone();
      const kernel = prepared.plan.kernels[i];
      times[kernel] = (times[kernel] ?? 0) + performance.now() - started;
    }
    return times;
  }

  destroy(prepared) {
    for (const buffer of Object.values(prepared.buffers)) buffer.destroy();
    prepared.uniforms.destroy();
  }

  // The device back to the browser; a run under way or later rejects.
  close() {
    this.lost = "the GPU was given back";
    this.device.destroy();
  }
}
