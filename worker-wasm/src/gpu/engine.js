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
  // Headless Chromium on Linux, a real GPU through Vulkan (an H200, 2026-11-28), answered
  // null to "high-performance" and gave the GPU to a plain request made just after.
  if (!adapter) adapter = await navigator.gpu.requestAdapter();
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
  // `code`: the gradient's kernels; `adamCode`: AdamW's step (adamw.wgsl), for segments.
  constructor(device, code, adamCode) {
    this.device = device;
    this.module = device.createShaderModule({ code });
    this.adamModule = device.createShaderModule({ code: adamCode });
    const read = { type: "read-only-storage" };
    const kinds = [{ type: "uniform" }, { type: "storage" }, read, { type: "storage" }, { type: "storage" }, read];
    this.adamLayout = device.createBindGroupLayout({
      entries: kinds.map((buffer, binding) => ({ binding, visibility: GPUShaderStage.COMPUTE, buffer })),
    });
    this.adamPipeline = device.createComputePipeline({
      layout: device.createPipelineLayout({ bindGroupLayouts: [this.adamLayout] }),
      compute: { module: this.adamModule, entryPoint: "adamw" },
    });
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
    const infos = [await this.module.getCompilationInfo(), await this.adamModule.getCompilationInfo()];
    const errors = infos.flatMap((info) => info.messages).filter((m) => m.type === "error");
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
  // grads: Float32Array (full layout)}, with `withActs` acts too (every activation, as the
  // forward pass left them: where a ReLU model's near-ties are read), or rejects with the
  // GPU's error. The arrays are copied before the first await (they may be views of wasm
  // memory).
  async run(prepared, weights, x, labels, masks, withActs) {
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
    const reads = [b.gRead, b.lossRead];
    if (withActs) {
      b.actRead ??= d.createBuffer({
        size: Math.max(4, plan.acts * 4),
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      });
      encoder.copyBufferToBuffer(b.act, 0, b.actRead, 0, plan.acts * 4);
      reads.push(b.actRead);
    }
    d.queue.submit([encoder.finish()]);
    const [validation, memory] = [await d.popErrorScope(), await d.popErrorScope()];
    const error = validation || memory;
    if (error) throw new Error(error.message);
    await within(RUN_MS, "the GPU", Promise.all(reads.map((r) => r.mapAsync(GPUMapMode.READ))));
    try {
      const grads = new Float32Array(b.gRead.getMappedRange(0, plan.params * 4).slice(0));
      const loss = new Float32Array(b.lossRead.getMappedRange(0, plan.rows * 4).slice(0));
      const acts = withActs
        ? new Float32Array(b.actRead.getMappedRange(0, plan.acts * 4).slice(0))
        : null;
      return { grads, loss, acts };
    } finally {
      reads.forEach((r) => r.unmap());
    }
  }

  // A local phase's segment: `steps` steps (`adam.length / 8`), each the plan's gradient
  // then AdamW's step, with the weights and moments staying on the GPU; resolves to
  // {state: Float32Array (weights, m, v), loss: Float32Array (a row's each, step after
  // step)}. `start` (weights, m, v) loads the state first, unless empty (the GPU holds it:
  // the last segment ended there); `decay` (the decayed ranges, start and end each) makes
  // the decay mask with the moments' buffers, once. Each step's inputs are `x`, `labels` and `masks` cut in `steps` equal
  // parts; its AdamW constants 8 values of `adam` [keep, step, c2, b1, 1-b1, b2, 1-b2, eps].
  async segment(prepared, start, decay, x, labels, masks, adam) {
    if (this.lost) throw new Error(this.lost);
    const d = this.device;
    const { buffers: b, plan } = prepared;
    const n = plan.params;
    const steps = adam.length / 8;
    d.pushErrorScope("out-of-memory");
    d.pushErrorScope("validation");
    if (!prepared.adam) {
      prepared.adam = this.adamBuffers(b, n);
      const mask = new Uint32Array(n);
      for (let i = 0; i + 1 < decay.length; i += 2) mask.fill(1, decay[i], decay[i + 1]);
      d.queue.writeBuffer(prepared.adam.buffers.decay, 0, mask);
    }
    const { buffers: s, group, x: gx, y: gy } = prepared.adam;
    if (start.length) {
      d.queue.writeBuffer(b.w, 0, start, 0, n);
      d.queue.writeBuffer(s.m, 0, start, n, n);
      d.queue.writeBuffer(s.v, 0, start, 2 * n, n);
    }
    const lossRead = d.createBuffer({
      size: Math.max(4, steps * plan.rows * 4),
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    });
    const constants = new ArrayBuffer(48);
    new Uint32Array(constants)[0] = n;
    const [xs, ls, ms] = [x.length / steps, labels.length / steps, masks.length / steps];
    for (let step = 0; step < steps; step++) {
      if (xs) d.queue.writeBuffer(b.act, 0, x, step * xs, xs);
      d.queue.writeBuffer(b.lab, 0, labels, step * ls, ls);
      if (ms) d.queue.writeBuffer(b.mask, 0, masks, step * ms, ms);
      new Float32Array(constants, 4, 8).set(adam.subarray(8 * step, 8 * step + 8));
      d.queue.writeBuffer(s.constants, 0, constants);
      const encoder = d.createCommandEncoder();
      const pass = encoder.beginComputePass();
      for (const { pipeline, group: g, x: dx, y: dy } of prepared.dispatches) {
        pass.setPipeline(pipeline);
        pass.setBindGroup(0, g);
        pass.dispatchWorkgroups(dx, dy);
      }
      pass.setPipeline(this.adamPipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(gx, gy);
      pass.end();
      encoder.copyBufferToBuffer(b.loss, 0, lossRead, step * plan.rows * 4, plan.rows * 4);
      d.queue.submit([encoder.finish()]);
    }
    const encoder = d.createCommandEncoder();
    encoder.copyBufferToBuffer(b.w, 0, s.read, 0, n * 4);
    encoder.copyBufferToBuffer(s.m, 0, s.read, n * 4, n * 4);
    encoder.copyBufferToBuffer(s.v, 0, s.read, 2 * n * 4, n * 4);
    d.queue.submit([encoder.finish()]);
    const [validation, memory] = [await d.popErrorScope(), await d.popErrorScope()];
    const error = validation || memory;
    if (error) {
      lossRead.destroy();
      throw new Error(error.message);
    }
    try {
      await within(
        RUN_MS * Math.max(1, steps),
        "the GPU",
        Promise.all([s.read.mapAsync(GPUMapMode.READ), lossRead.mapAsync(GPUMapMode.READ)]),
      );
      const state = new Float32Array(s.read.getMappedRange(0, 3 * n * 4).slice(0));
      const loss = new Float32Array(lossRead.getMappedRange().slice(0));
      s.read.unmap();
      return { state, loss };
    } finally {
      lossRead.destroy();
    }
  }

  // AdamW's buffers beside a plan's (weights `b.w`, gradient `b.g`): the moments, the
  // decay mask, the step's constants and the state's read-back, and their bind group.
  adamBuffers(b, n) {
    const d = this.device;
    const storage = () => d.createBuffer({ size: Math.max(4, n * 4), usage: STORAGE() });
    const buffers = {
      m: storage(),
      v: storage(),
      decay: storage(),
      constants: d.createBuffer({ size: 48, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST }),
      read: d.createBuffer({
        size: Math.max(4, 3 * n * 4),
        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      }),
    };
    const group = d.createBindGroup({
      layout: this.adamLayout,
      entries: [buffers.constants, b.w, b.g, buffers.m, buffers.v, buffers.decay].map((buffer, binding) => ({
        binding,
        resource: { buffer },
      })),
    });
    const groups = Math.max(1, Math.ceil(n / 64));
    const x = Math.min(groups, 65_535);
    return { buffers, group, x, y: Math.ceil(groups / x) };
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
    for (const buffer of Object.values(prepared.adam?.buffers ?? {})) buffer.destroy();
    prepared.uniforms.destroy();
  }

  // The device back to the browser; a run under way or later rejects.
  close() {
    this.lost = "the GPU was given back";
    this.device.destroy();
  }
}
