"""Inference throughput of ResNet-18 v1 and MobileNet 1.0 (224 x 224, random weights) at batch 1 and 32, two
threads, for oxnet or MXNet 1.9.1 (the Gluon model zoo, hybridized with static memory) or PyTorch (the same
networks written with torch.nn, eval mode, no_grad).

    python benches/bench_inference.py --framework oxnet|mxnet|torch [--repeat N]
    MXV=... TORCHV=... bash benches/run_side_by_side.sh benches/bench_inference.py

Prints one JSON row: images/s per case, from the median of `repeat` timed calls after two warm-up calls.
"""

import argparse
import json
import os
import statistics
import time

THREADS = 2
os.environ.setdefault("OXNET_CPU_WORKER_NTHREADS", str(THREADS))
os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", str(THREADS))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

import numpy as np  # noqa: E402

CASES = [("resnet18_v1", 1), ("resnet18_v1", 32), ("mobilenet1.0", 1), ("mobilenet1.0", 32)]


def median_seconds(run, repeat):
    for _ in range(2):
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gluon_runner(mx, name, batch):
    from importlib import import_module

    vision = import_module(mx.__name__ + ".gluon.model_zoo.vision")
    net = vision.get_model(name)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (batch, 3, 224, 224)).astype(np.float32))
    return lambda: net(x).wait_to_read()


def torch_models(torch):
    nn = torch.nn

    def conv_bn(cin, cout, k, stride, groups=1, relu=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return layers + ([nn.ReLU(inplace=True)] if relu else [])

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(*conv_bn(cin, cout, 3, stride), *conv_bn(cout, cout, 3, 1, relu=False))
            self.down = nn.Sequential(*conv_bn(cin, cout, 1, stride, relu=False)) if stride != 1 or cin != cout else None

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))

    def resnet18():
        layers = conv_bn(3, 64, 7, 2) + [nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
            cin = cout
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))

    def mobilenet():
        spec = [(32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2)] + \
               [(512, 512, 1)] * 5 + [(512, 1024, 2), (1024, 1024, 1)]
        layers = conv_bn(3, 32, 3, 2)
        for cin, cout, stride in spec:
            layers += conv_bn(cin, cin, 3, stride, groups=cin) + conv_bn(cin, cout, 1, 1)
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1024, 1000))

    return {"resnet18_v1": resnet18, "mobilenet1.0": mobilenet}


def torch_runner(torch, name, batch):
    net = torch_models(torch)[name]().eval()
    x = torch.from_numpy(np.random.RandomState(0).uniform(-1, 1, (batch, 3, 224, 224)).astype(np.float32))

    def run():
        with torch.no_grad():
            net(x)

    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", default="oxnet", choices=["oxnet", "mxnet", "torch"])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    if args.framework == "torch":
        import torch

        torch.set_num_threads(THREADS)
        version, make = torch.__version__, lambda name, batch: torch_runner(torch, name, batch)
    else:
        mx = __import__(args.framework)
        version, make = mx.__version__, lambda name, batch: gluon_runner(mx, name, batch)
    results = {}
    for name, batch in CASES:
        seconds = median_seconds(make(name, batch), args.repeat if batch == 1 else max(3, args.repeat // 2))
        results[f"{name} b{batch} img/s"] = round(batch / seconds, 1)
    print(json.dumps({"framework": args.framework, "version": version, "results": results}))


if __name__ == "__main__":
    main()
