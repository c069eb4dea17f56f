"""A minimal training job for the example image (the Dockerfile's CMD): a small model
fitted to random data through a DataLoader with worker processes, the shape of job
whose /dev/shm, thread counts and GPU envdoctor checks before it starts. Replace it
with your own; `python train.py --steps 3` is what the repository's test runs."""

import argparse
import os

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    # workers pass their batches through /dev/shm; pinned memory speeds the copy to a GPU
    loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=args.workers, pin_memory=device == "cuda")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    print(f"training on {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}", flush=True)
    step = 0
    while step < args.steps:
        for inputs, targets in loader:
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step >= args.steps:
                break
    print(f"done: {step} steps, last loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
