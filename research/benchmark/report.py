"""The benchmark's report: the environment it ran in and a table of the results
(torch only)."""

from __future__ import annotations

import os
import os.path as osp
import platform
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from ..memory import MiB

__all__ = ['environment', 'format_table', 'format_segmenter']


def _checkout() -> Path:
    """The repository root: the folder above ``research/`` (and ``lookhere_dense/``)."""
    return Path(__file__).resolve().parents[2]


def _mb(x: Optional[float]) -> str:
    return '-' if x is None else f'{x / MiB:,.0f} MiB'


def format_table(results: Dict[str, Any]) -> str:
    """Human-readable summary of the results: ``env`` (:func:`environment`) and any of the
    sections ``bias``, ``vit``, ``frame``, ``segmenter``, ``compile``, ``deploy``, ``peer``,
    ``attn``."""
    lines = [
        f'device: {results["env"]["device_name"]} | torch {results["env"]["torch"]} | '
        f'threads {results["env"]["threads"]}',
        '',
    ]
    b = results.get('bias')
    if b:
        lines.append(
            f'[bias] {b["grid"][0]}x{b["grid"][1]} grid, {b["layers"]} layers x '
            f'{b["heads"]} heads, preset {b["preset"]} '
            f'(baseline == ours on small grids: {b["baseline_matches_ours"]})'
        )
        o, t = b['ours'], b['baseline']
        if 'error' in o or 'error' in t:
            lines.append(f'  error: {o.get("error") or t.get("error")}')
        else:
            e = b['baseline_extrapolated']
            lines += [
                f'  ours (tables, {b["layers"]} layers): {o["seconds"] * 1e3:9.2f} ms   '
                f'peak RSS rise {_mb(o["peak_rise"])}',
                f'  baseline ({t["depth"]} layer measured): {t["seconds"]:9.2f} s    '
                f'peak RSS rise {_mb(t["peak_rise"])}',
                f'  baseline ({e["layers"]} layers, extrapolated): {e["seconds"]:9.2f} s    '
                f'peak RSS rise {_mb(e["peak_rise"])}',
                f'  speed-up {b["speedup_vs_extrapolated"]:,.0f}x '
                f'({b["speedup_vs_measured"]:,.0f}x vs the measured 1-layer run); memory '
                f'1/{1 / max(b["memory_ratio_vs_extrapolated"], 1e-12):,.0f} '
                f'(1/{1 / max(b["memory_ratio_vs_measured"], 1e-12):,.0f} vs 1 layer)',
                f"  (one layer's dense (heads, N+1, N+1) bias from the tables: "
                f'{o["dense_layer_seconds"] * 1e3:.0f} ms)',
                '',
            ]
    v = results.get('vit')
    if v:
        lines.append(
            f'[vit] {v["size"][0]}x{v["size"][1]}, batch {v["batch"]}, {v["tokens"]} '
            f'tokens; auto -> {v["auto_backend"]}'
        )
        lines.append(f'  {"model":<22}{"median s":>10}{"x no-bias":>11}{"cold s":>9}')
        for n, s in v['seconds'].items():
            lines.append(
                f'  {n:<22}{s:>10.3f}{v["ratio_vs_nobias"][n]:>11.3f}{v["cold_seconds"][n]:>9.2f}'
            )
        lines.append('')
    f = results.get('frame')
    if f:
        lines.append(
            f'[frame] {f["size"][0]}x{f["size"][1]}, batch 1, {f["tokens"]} tokens '
            f'(dense bias of all layers would be '
            f'{f["dense_bias_gib_all_layers"]:.1f} GiB)'
        )
        lines.append(
            f'  {"backend":<14}{"chosen":<10}{"s/forward":>10}{"x time":>8}'
            f'{"peak":>12}{"x peak":>8}{"fwd rise":>12}{"x rise":>8}'
        )
        for spec, c in f['cases'].items():
            if 'error' in c:
                lines.append(f'  {spec:<14}error: {c["error"]}')
                continue
            lines.append(
                f'  {spec:<14}{str(c["chosen"] or "-"):<10}{c["seconds"]:>10.2f}'
                f'{c.get("time_ratio", float("nan")):>8.3f}{_mb(c["peak"]):>12}'
                f'{c.get("peak_ratio", float("nan")):>8.3f}{_mb(c["peak_rise"]):>12}'
                f'{c.get("peak_rise_ratio", float("nan")):>8.3f}'
            )
        for spec, why in f['skipped'].items():
            lines.append(f'  {spec:<14}not run: {why}')
        lines.append('')
    sg = results.get('segmenter')
    if sg:
        meter = (
            'CUDA max allocated' if str(sg['device']).startswith('cuda') else 'process peak RSS'
        )
        lines.append(
            f'[segmenter] whole frame {sg["size"][0]}x{sg["size"][1]}, batch 1, '
            f'{meter}, fresh process per case; target: model peak <= '
            f'{sg["target"]} x backbone'
        )
        for res in sg['results']:
            lines += ['  ' + ln for ln in format_segmenter(res).splitlines()]
        lines.append('')
    c = results.get('compile')
    if c:
        lines.append(
            f'[compile] {c["size"][0]}x{c["size"][1]}, batch 1, torch.compile '
            f'backend {c["backend"]}, fresh process per mode'
        )
        lines.append(
            f'  {"mode":<11}{"first call s":>13}{"eager s":>10}{"compiled s":>12}'
            f'{"x eager":>9}{"max |diff|":>12}'
        )
        for mode, r in c['cases'].items():
            if 'error' in r:
                lines.append(f'  {mode:<11}error: {r["error"]}')
                continue
            diff = '-' if r['max_abs_diff'] is None else f'{r["max_abs_diff"]:.1e}'
            lines.append(
                f'  {mode:<11}{r["first_call_seconds"]:>13.1f}'
                f'{r["seconds"]["eager"]:>10.3f}{r["seconds"]["compiled"]:>12.3f}'
                f'{r["ratio"]:>9.3f}{diff:>12}'
            )
        lines.append('')
    dp = results.get('deploy')
    if dp:
        lines.append(
            f'[deploy] {osp.basename(dp["config"])} at {dp["size"][0]}x{dp["size"][1]}, '
            'random weights, fresh process per stage'
        )
        ex = dp['stages']['export']
        if 'error' in ex:
            lines.append(f'  export: error: {ex["error"]}')
        else:
            lines.append(
                f'  export {ex["export_seconds"]:.1f} s; files {_mb(ex["total_bytes"])} = '
                f'{ex["ratio_to_weights"]:.3f}x the fp32 weights ({_mb(ex["weights_bytes"])}); '
                f'largest constant {ex["largest_constant"][0]} {_mb(ex["largest_constant"][2])}'
            )
        for stage in ('torch', 'onnxruntime'):
            r = dp['stages'].get(stage, {})
            if 'error' in r or 'seconds' not in r:
                why = f'error: {r["error"]}' if 'error' in r else f'not run: {r.get("skipped")}'
                lines.append(f'  {stage}: {why}')
                continue
            lines.append(
                f'  {stage:<12}{r["seconds"]:>9.2f} s/run   peak {_mb(r["peak_over_before"])} '
                'over the RSS before the model / session'
            )
        if 'peak_ratio' in dp:
            lines.append(
                f'  onnxruntime / torch: peak {dp["peak_ratio"]:.3f}x, time '
                f'{dp["time_ratio"]:.3f}x; max |diff| {dp["max_abs_diff"]:.2e}'
            )
        lines.append('')
    pr = results.get('peer')
    if pr:
        lines += format_peer(pr)
    a = results.get('attn')
    if a:
        lines.append(
            f'[attn] preset {a["preset"]}, {a["dtype"]}; fraction of 128x128 tiles '
            f'flex skips (all heads)'
            + (f'; {a["repeats"]} interleaved rounds' if a.get('repeats') else '')
        )
        for tokens, c in a['cases'].items():
            line = f'  {tokens:>6} tokens {c["grid"][0]}x{c["grid"][1]}: '
            if 'skipped' in c:
                lines.append(line + f'not run: {c["skipped"]}')
                continue
            line += ', '.join(f'{d} {s:.0%}' for d, s in c['skipped_tile_fraction'].items())
            if 'seconds' in c:
                line += (
                    f' | flex {c["seconds"]["flex"] * 1e3:.2f} ms, x no-bias '
                    f'{c["flex_vs_nobias"]:.2f}, dense-bias/flex {c["dense_vs_flex"]:.2f}'
                )
            if 'train_seconds' in c:
                line += (
                    f' | fwd+bwd flex {c["train_seconds"]["flex"] * 1e3:.2f} ms, x no-bias '
                    f'{c["train_flex_vs_nobias"]:.2f}, dense-bias/flex '
                    f'{c["train_dense_vs_flex"]:.2f}'
                )
            lines.append(line)
    return '\n'.join(lines)


def format_peer(pr: Dict[str, Any]) -> List[str]:
    """Lines of the ``peer`` section: FLOP bounds, then one table per case group."""
    lines = [
        '[peer] against timm vit_base_patch16_224 (fresh process per case; ratios: '
        'per round vs timm, median)'
    ]
    for b in pr.get('bounds', []):
        lines.append(
            f'  FLOP bound {b["preset"]} at {b["grid"][0]}x{b["grid"][1]} patches: visible '
            f'{b["visible"]:.3f} of the pairs -> {b["bound"]:.3f}x the dense ViT '
            f'(tiled plan computes {b["computed"]:.3f} -> {b["plan_bound"]:.3f}x'
            + (
                f', fused plan {b["fused_computed"]:.3f} -> {b["fused_plan_bound"]:.3f}x)'
                if 'fused_computed' in b
                else ')'
            )
        )
    layers = [pr['layer']] if pr.get('layer') else []
    for layer in layers + list(pr.get('train_layer') or []):
        what = 'forward + backward' if layer.get('train') else 'inference'
        lines.append(
            f'  one attention layer, {layer["tokens"]} tokens, {what} (in process; x dense '
            f'SDPA without bias):'
        )
        for r in layer['rows']:
            lines.append(f'    {r["case"]:<22}{r["seconds"]:>8.3f} s{r["ratio"]:>8.3f}x')
    titles = dict(
        frame='whole frame, inference',
        big_frame='larger frame, inference',
        train='train step (forward_features + backward)',
        segmenter='Segmenter train step (loss + backward)',
    )
    for key, title in titles.items():
        group = pr.get(key)
        if not group:
            continue
        first = next(iter(group['runs'].values()))[0]
        size = first['size']
        timed = ''
        if key in ('frame', 'big_frame'):
            timed = (
                f' (median of {first.get("steps", 1)} frames after {first["warmup"]} untimed)'
                if first.get('warmup')
                else ' (the first frame of each process)'
            )
        best = all('best_ratio' in r for r in group['rows'] if 'error' not in r)
        lines.append(f'  {title} {size[0]}x{size[1]}{timed}:')
        lines.append(
            f'    {"model":<18}{"backend":<10}{"seconds":>9}{"x timm":>8}{"peak GiB":>10}'
            f'{"x timm":>8}' + (f'{"x timm, best step":>19}' if best else '')
        )
        for r in group['rows']:
            if 'error' in r:
                lines.append(f'    {r["model"]:<18}error: {r["error"]}')
                continue
            lines.append(
                f'    {r["model"]:<18}{str(r["backend"] or "-"):<10}{r["seconds"]:>9.2f}'
                f'{r["time_ratio"]:>8.3f}{r["peak_gib"]:>10.2f}{r["peak_ratio"]:>8.3f}'
                + (f'{r["best_ratio"]:>19.3f}' if best else '')
            )
            if 'peak_ratio_same_imports' in r:
                lines.append(
                    f'    {"  x timm+openmmlab":<28}{"":>9}'
                    f'{r["time_ratio_same_imports"]:>8.3f}{"":>10}'
                    f'{r["peak_ratio_same_imports"]:>8.3f}'
                )
    lines.append('')
    return lines


def format_segmenter(res: Dict[str, Any]) -> str:
    """A small text table of one ``whole_frame_memory`` result
    (:func:`research.benchmark.segmenter.whole_frame_memory`): per case its peak,
    rise, seconds, peak over the backbone's and the classes built; failed or skipped
    cases say why; the verdict on the target last."""
    lines = [
        f'{res["config"]}  {res["size"][0]}x{res["size"][1]}  {res["device"]}  '
        f'threads={res["threads"]}',
        f'  {"case":<9}{"peak":>12}{"rise":>12}{"seconds":>9}{"x peak":>8}  classes',
    ]
    for case, r in res['cases'].items():
        if 'peak_bytes' not in r:
            why = f'error: {r["error"]}' if 'error' in r else f'not run: {r.get("skipped")}'
            lines.append(f'  {case:<9}{why}')
            continue
        ratio = res['ratios'].get(f'{case}_peak', 1.0 if case == 'backbone' else None)
        lines.append(
            f'  {case:<9}{_mb(r["peak_bytes"]):>12}{_mb(r["rise_bytes"]):>12}'
            f'{r["seconds"]:>9.2f}{"-" if ratio is None else f"{ratio:.3f}":>8}  '
            f'{", ".join(r["types"].values())}'
        )
    if res['meets_target'] is not None:
        lines.append(
            f'  model peak <= {res["target"]} x backbone: {"yes" if res["meets_target"] else "NO"}'
        )
    return '\n'.join(lines)


def environment(device: str = 'cpu') -> Dict[str, Any]:
    """Machine and library facts recorded with the results: ``device``, ``device_name``
    (GPU or CPU model), ``torch``, ``commit`` (of the checkout, if it is one: ``git
    describe --always --dirty``, ending in ``-dirty`` with uncommitted changes), ``threads``,
    ``cpus``, ``python``, ``load_avg``."""
    name = platform.processor() or platform.machine()
    if device == 'cuda':
        name = torch.cuda.get_device_name(0)
    else:
        try:
            with open('/proc/cpuinfo') as f:
                name = next(ln.split(':', 1)[1].strip() for ln in f if 'model name' in ln)
        except (OSError, StopIteration):
            pass
    try:
        commit = subprocess.run(
            # '-dirty' where the checkout has uncommitted changes (as research/demo.py)
            ['git', '-C', str(_checkout()), 'describe', '--always', '--dirty'],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        commit = commit or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return dict(
        device=device,
        device_name=name,
        torch=torch.__version__,
        commit=commit,
        threads=torch.get_num_threads(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        load_avg=os.getloadavg() if hasattr(os, 'getloadavg') else None,
    )
