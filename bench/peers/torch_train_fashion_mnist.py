"""T1 (and T2 with --model cnn) in PyTorch on the GPU: the peer of `train_fashion_mnist --device cuda`.

The model, recipe and loop of examples/train_fashion_mnist.cpp (and of the libtorch CPU peer,
torch_train_fashion_mnist.cpp): nn.Sequential of Linear(784, 256), ReLU, Linear(256, 128), ReLU,
Linear(128, 10) (--model cnn: Conv2d(1, 32, 5), ReLU, MaxPool2d(2), Conv2d(32, 64, 5), ReLU,
MaxPool2d(2), Flatten, Linear(1024, 10) on [128, 1, 28, 28]); torch.optim.AdamW(lr 1e-3, betas
0.9/0.999, eps 1e-8, weight decay 0.01, fused=True); F.cross_entropy on int64 labels; batch 128,
shuffled each epoch, the last partial batch dropped; loss.item() every step (fusebox reads its loss
every step too); the test pass under no_grad in eval mode at batch 500, argmax on the device.
--schedule cosine sets lr0 (1 + cos(pi e / E)) / 2 before epoch e, as fusebox does.

Data: the Fashion-MNIST IDX files (.gz or not) from --data, the directory fusebox reads; on the GPU
machine that is .deps/usr/share/datasets/fashion-mnist after ../shared/device/stage-deps.sh --data.
The training set lives on the GPU and each batch is an index_select of a device permutation (what a
PyTorch user does with a data set this small); --host-batches instead gathers each batch on the
host into pinned memory and copies it with non_blocking=True (closer to fusebox's loader).

--mode eager (default) or compile (torch.compile of the model, default options); epoch 1 of
compile includes compiling, and the summary's median is over the epochs after the first, as
fusebox's. Prints the same table and JSON fields as fusebox, with "system": "torch".

    python3 bench/peers/torch_train_fashion_mnist.py --data DIR [--epochs 10] [--mode eager|compile]
            [--model mlp|cnn] [--lr 1e-3] [--weight-decay 0.01] [--schedule constant|cosine] [--seed 1]
            [--host-batches]
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

BATCH, EVAL_BATCH = 128, 500


def read_idx(directory, name):
    """An IDX file (uint8 data only) as a uint8 tensor of its dimensions."""
    path = os.path.join(directory, name)
    if os.path.exists(path + ".gz"):
        with gzip.open(path + ".gz", "rb") as f:
            raw = f.read()
    elif os.path.exists(path):
        with open(path, "rb") as f:
            raw = f.read()
    else:
        sys.exit(f"torch_train_fashion_mnist.py: {path}(.gz) not found (--data DIR)")
    zero, kind, rank = struct.unpack(">HBB", raw[:4])
    if zero != 0 or kind != 0x08:
        sys.exit(f"torch_train_fashion_mnist.py: {path} is not a uint8 IDX file")
    dims = struct.unpack(">" + "I" * rank, raw[4:4 + 4 * rank])
    data = torch.frombuffer(bytearray(raw[4 + 4 * rank:]), dtype=torch.uint8)
    return data.reshape(dims)


def load(directory):
    def images(name):
        x = read_idx(directory, name)
        return (x.reshape(x.shape[0], 784).float() / 255.0).contiguous()

    def labels(name):
        return read_idx(directory, name).long()

    return (images("train-images-idx3-ubyte"), labels("train-labels-idx1-ubyte"),
            images("t10k-images-idx3-ubyte"), labels("t10k-labels-idx1-ubyte"))


def make_model(cnn):
    if cnn:
        return nn.Sequential(nn.Unflatten(1, (1, 28, 28)), nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1024, 10))
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist/")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--mode", choices=("eager", "compile"), default="eager")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--schedule", choices=("constant", "cosine"), default="constant")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--host-batches", action="store_true")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_train_fashion_mnist.py: no CUDA device (torch.cuda.is_available() is False)")
    dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name(dev)
    train_x, train_y, test_x, test_y = load(a.data)
    n, nt = train_x.shape[0], test_x.shape[0] // EVAL_BATCH * EVAL_BATCH
    test_x, test_y = test_x[:nt].to(dev), test_y[:nt].to(dev)
    if a.host_batches:
        train_x, train_y = train_x.pin_memory(), train_y.pin_memory()
        xb = torch.empty(BATCH, 784).pin_memory()
        yb = torch.empty(BATCH, dtype=torch.long).pin_memory()
    else:
        train_x, train_y = train_x.to(dev), train_y.to(dev)

    torch.manual_seed(a.seed)
    model = make_model(a.model == "cnn").to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay,
                            fused=True)
    run = torch.compile(model) if a.mode == "compile" else model
    workload = "T2" if a.model == "cnn" else "T1"
    print(f"{workload} Fashion-MNIST on {gpu}, torch {torch.__version__} {a.mode}, AdamW (fused) lr {a.lr:g} "
          f"({a.schedule}) wd {a.weight_decay:g}, batch {BATCH}, {n} train / {nt} test samples, "
          f"{'host' if a.host_batches else 'device'} batches, TF32 matmul "
          f"{'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}")
    print(f"{'epoch':>5}  {'train loss':>10}  {'test acc':>9}  {'train s':>9}  {'test s':>8}  {'samples/s':>10}")
    base = {"workload": workload, "system": "torch", "mode": a.mode, "device": "cuda", "gpu": gpu}
    secs, accuracy = [], 0.0
    for epoch in range(a.epochs):
        if a.schedule == "cosine":
            for g in opt.param_groups:
                g["lr"] = a.lr * (1 + math.cos(math.pi * epoch / a.epochs)) / 2
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(n, device="cpu" if a.host_batches else dev)
        loss_sum, steps = 0.0, 0
        for s in range(0, n - BATCH + 1, BATCH):
            idx = perm[s:s + BATCH]
            if a.host_batches:
                torch.index_select(train_x, 0, idx, out=xb)
                torch.index_select(train_y, 0, idx, out=yb)
                x, y = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
            else:
                x, y = train_x.index_select(0, idx), train_y.index_select(0, idx)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(run(x), y)
            loss.backward()
            opt.step()
            loss_sum += loss.item()  # waits for the step, so the pinned staging is free again
            steps += 1
        torch.cuda.synchronize()
        train_s = time.perf_counter() - t0
        secs.append(train_s)
        rate = steps * BATCH / train_s
        t1 = time.perf_counter()
        correct = 0
        with torch.no_grad():
            model.eval()
            for s in range(0, nt, EVAL_BATCH):
                pred = run(test_x[s:s + EVAL_BATCH]).argmax(1)
                correct += int(pred.eq(test_y[s:s + EVAL_BATCH]).sum().item())
        test_s = time.perf_counter() - t1
        accuracy = correct / nt
        mean_loss = loss_sum / steps
        print(f"{epoch + 1:5d}  {mean_loss:10.4f}  {100 * accuracy:8.2f}%  {train_s:9.2f}  {test_s:8.2f}  {rate:10.0f}")
        print(json.dumps({**base, "epoch": epoch + 1, "seconds": round(train_s, 4), "test_seconds": round(test_s, 4),
                          "samples_per_s": round(rate), "loss": round(mean_loss, 6), "accuracy": round(accuracy, 4)},
                         separators=(",", ":")), flush=True)
    later = sorted(secs[1:] if len(secs) > 1 else secs)
    median = later[len(later) // 2] if later else 0.0
    print(json.dumps({**base, "epochs": a.epochs, "median_epoch_s": round(median, 4),
                      "samples_per_s": round(n // BATCH * BATCH / median) if median else 0,
                      "accuracy": round(accuracy, 4)}, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
