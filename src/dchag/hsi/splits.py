"""How labelled pixels are split into train, val and test: per class at random
(``stratified``), by image blocks so that no patch of one split shares a pixel with another
(``disjoint``), or, for a tile set, by whole tiles (``tile_split``). Every function returns flat
pixel indices per split."""

from __future__ import annotations

import numpy as np

from .image import HsiInputError

SPLITS = ("train", "val", "test")


def fractions_of(fractions) -> np.ndarray:
    f = np.asarray(fractions, dtype=float)
    if f.shape != (3,) or np.any(f < 0) or not np.isclose(f.sum(), 1.0):
        raise HsiInputError(
            f"split fractions {list(fractions)} must be three non-negative numbers summing to 1 (train, val, test)"
        )
    return f


def stratified_split(labels: np.ndarray, fractions, seed: int) -> dict[str, np.ndarray]:
    """Per class, shuffled: the first fraction to train, the next to val, the rest to test
    (at least one training pixel per class). Returns flat pixel indices per split."""
    f = fractions_of(fractions)
    rng = np.random.default_rng(seed)
    flat = labels.ravel()
    out = {s: [] for s in SPLITS}
    for cls in np.unique(flat[flat > 0]):
        idx = rng.permutation(np.flatnonzero(flat == cls))
        n_train = max(1, int(round(f[0] * idx.size)))
        n_val = int(round(f[1] * idx.size))
        out["train"].append(idx[:n_train])
        out["val"].append(idx[n_train : n_train + n_val])
        out["test"].append(idx[n_train + n_val :])
    return {s: np.sort(np.concatenate(v)) if v else np.array([], int) for s, v in out.items()}


def _pure(id_map: np.ndarray, patch: int) -> np.ndarray:
    """True where the patch x patch window around a pixel (edge-padded, as the patches are
    reflect-padded) holds one value of ``id_map`` only."""
    from scipy.ndimage import maximum_filter, minimum_filter  # separable: O(patch), not O(patch^2), per pixel

    return minimum_filter(id_map, size=patch, mode="nearest") == maximum_filter(id_map, size=patch, mode="nearest")


def class_counts(labels: np.ndarray, splits: dict[str, np.ndarray], k: int) -> dict[str, list[int]]:
    """Per split, the number of samples of each class 1..k."""
    flat = labels.ravel()
    return {s: np.bincount(flat[idx], minlength=k + 1)[1:].astype(int).tolist() for s, idx in splits.items()}


def _repair(assign: np.ndarray, kept, per_block: np.ndarray, wanted: list[int], nbx: int, ny: int) -> np.ndarray:
    """Blocks moved so that a class absent from a split gets there (a block, or a block with its
    neighbours, whose move leaves no class absent from another split); ``kept(assign)``: the
    kept centres per (split, class); ``nbx`` x ``ny`` blocks."""
    n_classes = per_block.shape[1] - 1
    for _ in range(3):
        counts = kept(assign)
        missing = [
            (k, s) for k in range(1, n_classes + 1) for s in wanted if counts[s, k] == 0 and per_block[:, k].any()
        ]
        if not missing:
            break
        for k, s in missing:
            counts = kept(assign)
            if counts[s, k]:
                continue
            present = counts > 0
            for b in np.flatnonzero(per_block[:, k])[np.argsort(-per_block[per_block[:, k] > 0, k], kind="stable")][
                :24
            ]:
                by, bx = divmod(int(b), nbx)
                around = [
                    y * nbx + x
                    for y in range(max(0, by - 1), min(ny, by + 2))
                    for x in range(max(0, bx - 1), min(nbx, bx + 2))
                ]
                moved = False
                for region in ([int(b)], around):
                    trial = assign.copy()
                    trial[region] = s
                    after = kept(trial)
                    if after[s, k] and np.all(after[present] > 0):
                        assign, moved = trial, True
                        break
                if moved:
                    break
    return assign


def disjoint_split(
    labels: np.ndarray, fractions, seed: int, block: int, patch: int
) -> tuple[dict[str, np.ndarray], int]:
    """Square blocks of the image go whole to one split, so train, val and test windows never
    share a pixel: a pixel is a patch centre only if its whole window lies in blocks of its own
    split. Blocks are placed per class, rarest class first, so that every class with a block
    able to hold a whole window gets one in every split; the other blocks then go to the split
    furthest below its fraction of labelled pixels, and unlabelled blocks join their
    neighbours' split (fewer windows cut at block edges). Returns (splits, dropped centres)."""
    f = fractions_of(fractions)
    rows, cols = labels.shape
    nbx = -(-cols // block)
    block_id = (np.arange(rows) // block)[:, None] * nbx + (np.arange(cols) // block)[None, :]
    n_blocks = int(block_id.max()) + 1
    labelled = labels > 0
    n_classes = int(labels.max())
    safe = _pure(block_id, patch) & labelled  # a window that stays in its own block
    per_block = np.zeros((n_blocks, n_classes + 1), int)
    np.add.at(per_block, (block_id[labelled], labels[labelled]), 1)
    safe_block = np.zeros((n_blocks, n_classes + 1), int)
    np.add.at(safe_block, (block_id[safe], labels[safe]), 1)
    total = per_block[:, 1:].sum(1)
    rng = np.random.default_rng(seed)
    tiebreak = rng.permutation(n_blocks)
    assign = np.full(n_blocks, -1)
    wanted = [s for s in range(3) if f[s] > 0]
    # 1. every class into every split, rarest class first, each time the smallest fitting block
    for k in np.argsort(per_block[:, 1:].sum(0), kind="stable") + 1:
        for s in wanted:
            if np.any((assign == s) & (safe_block[:, k] > 0)):
                continue
            cands = np.flatnonzero((assign < 0) & (safe_block[:, k] > 0))
            if cands.size:
                assign[cands[np.lexsort((tiebreak[cands], total[cands]))[0]]] = s
    # 2. the other labelled blocks to the split furthest below its share of labelled pixels
    target = f * total.sum()
    filled = np.array([total[assign == s].sum() for s in range(3)], float)
    for b in rng.permutation(n_blocks):
        if assign[b] < 0 and total[b] > 0:
            s = int(np.argmax(np.where(f > 0, target - filled, -np.inf)))
            assign[b] = s
            filled[s] += total[b]
    # 3. unlabelled blocks: the most common split among their assigned neighbours
    grid = assign.reshape(-1, nbx)
    for b in np.flatnonzero(assign < 0):
        by, bx = divmod(b, nbx)
        near = grid[max(0, by - 1) : by + 2, max(0, bx - 1) : bx + 2].ravel()
        near = near[near >= 0]
        assign[b] = np.bincount(near, minlength=3).argmax() if near.size else int(np.argmax(f))

    def kept(a: np.ndarray) -> np.ndarray:  # (split, class) -> kept centres
        split_map = a[block_id]
        ok = labelled & _pure(split_map, patch)
        return np.stack([np.bincount(labels[ok & (split_map == i)], minlength=n_classes + 1) for i in range(3)])

    # 4. repair: a class still absent from a split (its pixels near block edges only) gets a
    #    block, or a block with its neighbours, moved there if no class leaves another split
    assign = _repair(assign, kept, per_block, wanted, nbx, -(-rows // block))
    split_map = assign[block_id]
    pure = _pure(split_map, patch)
    out = {s: np.flatnonzero((labelled & pure & (split_map == i)).ravel()) for i, s in enumerate(SPLITS)}
    dropped = int(labelled.sum() - sum(v.size for v in out.values()))
    return out, dropped


def disjoint_split_placing_classes(
    labels: np.ndarray, fractions, seed: int, patch: int, block: int | None = None
) -> tuple[dict[str, np.ndarray], int, int]:
    """The disjoint split with ``block``, or (None) with the largest block from 2 x patch down
    to patch that puts every class in every split (smaller blocks place more classes and drop
    more centres at block edges); where none does, the one that misses fewest. Returns
    (splits, dropped centres, block)."""
    f = fractions_of(fractions)
    present = np.bincount(labels.ravel(), minlength=int(labels.max()) + 1)[1:] > 0
    best = None
    for size in [block] if block else range(2 * patch, patch - 1, -1):
        splits, dropped = disjoint_split(labels, fractions, seed, size, patch)
        counts = np.stack([np.bincount(labels.ravel()[splits[s]], minlength=present.size + 1)[1:] for s in SPLITS])
        misses = int(((counts[f > 0] == 0) & present).sum())
        if best is None or misses < best[0]:
            best = (misses, splits, dropped, size)
        if misses == 0:
            break
    return best[1], best[2], best[3]


def missing_classes(counts: dict[str, list[int]], fractions, names: list[str], labels: np.ndarray) -> list[str]:
    """'<class> (<pixels> pixels): none in <splits>' for every labelled class absent from a
    split that has a non-zero fraction."""
    f = fractions_of(fractions)
    pixels = np.bincount(labels.ravel(), minlength=len(names) + 1)[1:]
    out = []
    for k, name in enumerate(names):
        if pixels[k] == 0:
            continue
        absent = [s for i, s in enumerate(SPLITS) if f[i] > 0 and counts[s][k] == 0]
        if absent:
            out.append(f"{name} ({pixels[k]} pixels): none in {', '.join(absent)}")
    return out


def format_counts(counts: dict[str, list[int]], names: list[str]) -> str:
    width = max(len(n) for n in names)
    lines = [f"{'class':{width}s} " + " ".join(f"{s:>7s}" for s in SPLITS)]
    lines += [f"{name:{width}s} " + " ".join(f"{counts[s][k]:7d}" for s in SPLITS) for k, name in enumerate(names)]
    return "\n".join(lines)


def tile_split(tile_labels: list[np.ndarray], fractions, seed: int) -> dict[str, np.ndarray]:
    """Whole tiles to one split (no patch window crosses a tile, so splits never share a
    pixel). Tiles are placed per class, rarest class first, each time the tile with the fewest
    labelled pixels that holds the class, so that every class with tiles enough is in every
    split; the other labelled tiles then go to the split furthest below its share of labelled
    pixels. Returns flat indices into the tiles' concatenated pixels, per split."""
    f = fractions_of(fractions)
    n_classes = max(int(t.max()) for t in tile_labels)
    per_tile = np.stack([np.bincount(t.ravel(), minlength=n_classes + 1)[1:] for t in tile_labels])
    total = per_tile.sum(1)
    rng = np.random.default_rng(seed)
    tiebreak = rng.permutation(len(tile_labels))
    assign = np.full(len(tile_labels), -1)
    wanted = [s for s in range(3) if f[s] > 0]
    for k in np.argsort(per_tile.sum(0), kind="stable"):
        for s in wanted:
            if np.any((assign == s) & (per_tile[:, k] > 0)):
                continue
            cands = np.flatnonzero((assign < 0) & (per_tile[:, k] > 0))
            if cands.size:
                assign[cands[np.lexsort((tiebreak[cands], total[cands]))[0]]] = s
    target = f * total.sum()
    filled = np.array([total[assign == s].sum() for s in range(3)], float)
    for t in rng.permutation(len(tile_labels)):
        if assign[t] < 0 and total[t] > 0:
            s = int(np.argmax(np.where(f > 0, target - filled, -np.inf)))
            assign[t] = s
            filled[s] += total[t]
    offsets = np.cumsum([0] + [t.size for t in tile_labels])
    out = {s: [] for s in SPLITS}
    for t, labels in enumerate(tile_labels):
        if assign[t] >= 0:
            out[SPLITS[assign[t]]].append(offsets[t] + np.flatnonzero(labels.ravel() > 0))
    return {s: np.concatenate(v) if v else np.array([], np.int64) for s, v in out.items()}
