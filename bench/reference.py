#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The plain PyTorch programs fulgur is measured against.

Modes:
  init   write the initial weights of a model (a bare state_dict, torch.save)
  eager  DistributedDataParallel over Gloo, torch.utils.data.DataLoader with a
         DistributedSampler, one process per rank (torch.multiprocessing)
  lazy   the same model on torch._lazy (TorchScript backend); gradients
         all-reduced with Gloo at the optimizer step and a step mark per step,
         as torch_xla's optimizer_step does

The models have the parameter names of the C++ ones (examples/mnist/mnist_module.h,
examples/charlm/charlm_module.h), so one state_dict starts both sides; the data is
read and normalised as src/data/mnist.cpp and src/data/text.cpp do.

--mode and --model take comma-separated lists, run one after the other in this
process (Python and torch start once). Each rank writes
<out>_<mode>_<model>.<rank>.json: samples/s over the timed steps (after the
warm-up steps), the loss of the last step, graphs compiled (lazy), peak RSS.
"""
import argparse
import json
import math
import os
import socket
import struct
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset


# --- models -----------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


class SelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_embd, n_embd)
        self.key = nn.Linear(n_embd, n_embd)
        self.value = nn.Linear(n_embd, n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x, mask):
        b, t, c = x.shape
        hd = c // self.n_head

        def heads(y):
            return y.view(b, t, self.n_head, hd).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = torch.softmax(att + mask, -1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = SelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd)
        self.fc1 = nn.Linear(n_embd, 4 * n_embd)
        self.fc2 = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class CharLM(nn.Module):
    def __init__(self, vocab_size, block_size=64, n_embd=128, n_head=4, n_layer=2):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "ln" in name:
                    continue
                if name.endswith(".bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)
        self.register_buffer("mask", torch.full((block_size, block_size), float("-inf")).triu(1))

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb.weight
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln_f(x))


CHARLM_CFG = dict(block_size=64, n_embd=128, n_head=4, n_layer=2)
LR = {"mlp": 1e-3, "cnn": 1e-3, "charlm": 3e-3}


def loss_of(model_name, model, x, y):
    out = model(x)
    if model_name == "charlm":
        return F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))
    return F.cross_entropy(out, y)


def make_optimizer(model_name, params):
    if model_name == "charlm":
        return torch.optim.AdamW(params, lr=LR[model_name])
    return torch.optim.Adam(params, lr=LR[model_name])


# --- data -------------------------------------------------------------------

def read_idx(path, magic):
    with open(path, "rb") as f:
        data = f.read()
    got, = struct.unpack(">I", data[:4])
    if got != magic:
        raise SystemExit(f"{path}: magic {got}, expected {magic}")
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).view(*shape)


def mnist_train(data_dir):
    images = read_idx(os.path.join(data_dir, "mnist", "train-images-idx3-ubyte"), 2051)
    labels = read_idx(os.path.join(data_dir, "mnist", "train-labels-idx1-ubyte"), 2049)
    x = images.to(torch.float32).div_(255.0).sub_(0.1307).div_(0.3081).unsqueeze(1).contiguous()
    y = labels.to(torch.int64)
    return TensorDataset(x[:55000], y[:55000])


class CharDataset(Dataset):
    """Windows of the text as token ids: sample i is tokens[i:i+T], target tokens[i+1:i+T+1]."""

    def __init__(self, path, block_size):
        with open(path, "rb") as f:
            text = f.read()
        vocab = sorted(set(text))
        stoi = torch.full((256,), -1, dtype=torch.int64)
        stoi[torch.tensor(vocab, dtype=torch.int64)] = torch.arange(len(vocab))
        self.tokens = stoi[torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int64)]
        self.vocab_size = len(vocab)
        self.block_size = block_size
        self.n = (self.tokens.numel() - block_size) * 9 // 10  # the training part

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.tokens[i:i + self.block_size], self.tokens[i + 1:i + 1 + self.block_size]


def make_model(name, data_dir):
    if name == "mlp":
        return MLP()
    if name == "cnn":
        return CNN()
    if name == "charlm":
        return CharLM(charlm_vocab(data_dir), **CHARLM_CFG)
    raise SystemExit(f"unknown model {name}")


def charlm_vocab(data_dir):
    with open(os.path.join(data_dir, "kjv.txt"), "rb") as f:
        return len(set(f.read()))


def make_dataset(name, data_dir):
    if name == "charlm":
        return CharDataset(os.path.join(data_dir, "kjv.txt"), CHARLM_CFG["block_size"])
    return mnist_train(data_dir)


# --- measurement --------------------------------------------------------------

def peak_rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def lazy_graphs_compiled():
    import torch._lazy.metrics as metrics
    return int(metrics.counter_value("UncachedCompile") or 0)


class Timer:
    """Wall time of steps [warmup, warmup + steps), read at step boundaries."""

    def __init__(self, args):
        self.args = args
        self.start = None
        self.elapsed = None

    def after_step(self, step, loss):
        a = self.args
        if step + 1 == a.warmup:
            loss.item()
            self.start = time.perf_counter()
        if step + 1 == a.warmup + a.steps:
            value = loss.item()
            self.elapsed = time.perf_counter() - (self.start if self.start is not None else self.t0)
            return value
        return None


def write_result(args, rank, world, loss, elapsed, extra):
    timed = args.steps
    res = {
        "side": "python_" + args.mode,
        "model": args.model,
        "rank": rank,
        "world_size": world,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "warmup": args.warmup,
        "batch_size": args.batch_size,
        "seconds": elapsed,
        "samples_per_s": args.batch_size * world * timed / elapsed,
        "step_seconds": elapsed / timed,
        "final_loss": loss,
        "peak_rss_mb": peak_rss_mb(),
    }
    res.update(extra)
    with open(f"{args.out}_{args.mode}_{args.model}.{rank}.json", "w") as f:
        json.dump(res, f)


def batches(loader, sampler):
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for b in loader:
            yield b
        epoch += 1


def make_loader(args, dataset, rank, world):
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.num_workers)
    return loader, sampler


def run_eager(rank, args):
    world = args.nproc
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    dataset = make_dataset(args.model, args.data_dir)
    model = make_model(args.model, args.data_dir)
    model.load_state_dict(torch.load(init_path(args)))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = make_optimizer(args.model, ddp.parameters())
    loader, sampler = make_loader(args, dataset, rank, world)
    timer = Timer(args)
    timer.t0 = time.perf_counter()
    loss_value = None
    for step, (x, y) in enumerate(batches(loader, sampler)):
        if step == args.warmup + args.steps:
            break
        opt.zero_grad()
        loss = loss_of(args.model, ddp, x, y)
        loss.backward()
        opt.step()
        v = timer.after_step(step, loss)
        if v is not None:
            loss_value = v
    extra = {}
    if args.raw_allreduce and world > 1:
        extra.update(raw_allreduce(model))
    write_result(args, rank, world, loss_value, timer.elapsed, extra)
    finish(world)


def raw_allreduce(model, reps=40):
    """One Gloo all-reduce of as many bytes as the model's gradients: median seconds."""
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    buf = torch.zeros(n)
    times = []
    for _ in range(reps):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - t)
    times.sort()
    return {"raw_allreduce_seconds": times[len(times) // 2], "grad_bytes": n * 4}


def run_lazy(rank, args):
    import torch._lazy
    import torch._lazy.ts_backend
    world = args.nproc
    torch.set_num_threads(args.threads)
    if not getattr(torch._lazy.ts_backend, "_bench_started", False):
        torch._lazy.ts_backend.init()  # once per process: a second call throws
        torch._lazy.ts_backend._bench_started = True
    compiled_before = lazy_graphs_compiled()
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    device = torch.device("lazy")
    dataset = make_dataset(args.model, args.data_dir)
    model = make_model(args.model, args.data_dir)
    model.load_state_dict(torch.load(init_path(args)))
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(args.model, params)
    loader, sampler = make_loader(args, dataset, rank, world)
    timer = Timer(args)
    timer.t0 = time.perf_counter()
    loss_value = None
    for step, (x, y) in enumerate(batches(loader, sampler)):
        if step == args.warmup + args.steps:
            break
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = loss_of(args.model, model, x, y)
        loss.backward()
        if world > 1:
            # torch_xla's reduce_gradients: one flattened sum, scaled by 1/world.
            torch._lazy.mark_step()
            grads = [p.grad.cpu() for p in params]
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            flat.div_(world)
            for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, grads)):
                p.grad = g.to(device)
        opt.step()
        torch._lazy.mark_step()
        v = timer.after_step(step, loss)
        if v is not None:
            loss_value = v
    write_result(args, rank, world, loss_value, timer.elapsed, {"graphs_compiled": lazy_graphs_compiled() - compiled_before})
    finish(world)


def finish(world):
    """Leaves the process group. A forked worker ends here without tearing the
    objects down: with Debian's torch 1.13, DDP's Reducer destructor can
    deadlock in ~ProcessGroupGloo (seen: a worker hung after its result was written)."""
    if world > 1:
        os._exit(0)
    if dist.is_initialized():
        dist.destroy_process_group()


def init_path(args):
    return os.path.join(args.init_dir, f"{args.model}.pt")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, help="init, eager, lazy, or a list: eager,lazy")
    p.add_argument("--model", required=True, help="mlp, cnn, charlm, or a list")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--init-dir", required=True, help="initial weights <init-dir>/<model>.pt (written by --mode init)")
    p.add_argument("--out", help="result prefix: <out>_<mode>_<model>.<rank>.json")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch threads per process (0: cores / nproc)")
    p.add_argument("--batch-size", type=int, default=0, help="per process (0: 64 for MNIST, 32 for charlm)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--raw-allreduce", action="store_true", help="also time a raw all-reduce of the gradient bytes")
    args = p.parse_args()
    modes, models = args.mode.split(","), args.model.split(",")
    for m in modes:
        if m not in ("init", "eager", "lazy"):
            raise SystemExit(f"reference.py: mode '{m}' is unknown; choose init, eager or lazy")
    for m in models:
        if m not in LR:
            raise SystemExit(f"reference.py: model '{m}' is unknown; choose mlp, cnn or charlm")
    if args.threads <= 0:
        args.threads = max(1, len(os.sched_getaffinity(0)) // args.nproc)
    batch_arg = args.batch_size
    for mode in modes:
        for model in models:
            args.mode, args.model = mode, model
            args.batch_size = batch_arg or (32 if model == "charlm" else 64)
            if mode == "init":
                torch.manual_seed(args.seed)
                # A plain dict: libtorch's unpickler reads an OrderedDict as None.
                torch.save(dict(make_model(model, args.data_dir).state_dict()), init_path(args))
                continue
            args.port = free_port()
            fn = run_eager if mode == "eager" else run_lazy
            if args.nproc == 1:
                fn(0, args)
            else:
                import torch.multiprocessing as mp
                mp.start_processes(fn, args=(args,), nprocs=args.nproc, start_method="fork")


if __name__ == "__main__":
    main()
