"""Train the probe-size DeiT on ``glyph_match`` with a plain PyTorch loop, sharing no code with our
engine (only the probe generator): a check that DeiT's failure on the probe is not our loop's.

    OMP_NUM_THREADS=1 python benchmarks/examples/probe_deit_plain_loop.py --lr 3e-4 --pool avg --epochs 12

The model is timm's ``deit_tiny_patch16_224`` at 64 px, patch 4, 64-d, 4 blocks, 4 heads (the
issue's probe size); Adam at a constant rate, no weight decay, batch 64, no augmentation. Prints the
training loss and the held-out accuracy after every epoch.
"""

from __future__ import annotations

import argparse

import timm
import torch
import torch.nn.functional as F

from weightformer.data.probes import glyph_match


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--pool", choices=["token", "avg"], default="avg", help="class token or average pooling")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)

    def tensors(images, labels):  # uint8 (N, 64, 64) -> normalised (N, 1, 64, 64), as the probe data set
        return (torch.from_numpy(images).float()[:, None] / 255 - 0.05) / 0.2, torch.from_numpy(labels)

    x, y = tensors(*glyph_match(4000, 64, seed=0))
    xv, yv = tensors(*glyph_match(1000, 64, seed=1))
    pool = {"global_pool": "avg", "class_token": False} if args.pool == "avg" else {}
    model = timm.create_model("deit_tiny_patch16_224", img_size=64, in_chans=1, num_classes=2, patch_size=4,
                              embed_dim=64, depth=4, num_heads=4, **pool)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        model.train()
        total = 0.0
        for idx in torch.randperm(len(x)).split(args.batch_size):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        model.eval()
        with torch.no_grad():
            accuracy = (model(xv).argmax(1) == yv).float().mean().item()
        print(f"lr {args.lr} pool {args.pool} epoch {epoch}: train loss {total / len(x):.4f} "
              f"held-out accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
