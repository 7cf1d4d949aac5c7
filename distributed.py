"""Several processes: the collectives the training loop needs and the update's DDP / FSDP2 wrappers, all through
`accelerate` (paper: not covered; the paper trains on GPUs with verl/Ray, official code: FSDP through verl).

What it implements
- `Dist`: gather / sum / any over processes; `prepared(module)`: the module the update trains through, prepared
  by `accelerate` (DDP by default; FSDP2 with accelerate's FSDP settings); under FSDP2 `full_weights` (gather the
  shards whole between updates, so rollouts run on each process alone) and `reshard` (a clean sharded state before
  each update); everything is an identity in one process.
- `make_accelerator`: accelerate's Accelerator, plus NANORAGEN_CPU_FSDP=1 to run its FSDP2 path on CPU processes
  (accelerate selects FSDP only on GPUs; torch's fully_shard runs on CPU with gloo): how the tests check FSDP.
- `check_world`: what a launch cannot do, refused before any compute (groups not divisible by processes; FSDP1;
  under FSDP the gradient analysis, LoRA and the vLLM backend).
- `fsdp_state`: checkpoints under FSDP2 (rank 0's gathered state dicts, loaded back by broadcast).
How the update stays exact across processes (padding to equal micro-batch counts, losses x processes): update.py.
Leaves out: DeepSpeed ZeRO (its engine owns the optimizer step and gradient accumulation, which update.py does),
tensor / pipeline parallelism. Run: `torchrun --nproc_per_node 2 train.py --cpu ...`; tests: tests/test_train.py.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

import config


class Dist:
    """The few collective operations the loop needs and the accelerate-prepared (DDP / FSDP2) training wrappers;
    all are identities in a single process."""

    def __init__(self, acc):
        self.acc, self.world, self.rank, self.main = acc, acc.num_processes, acc.process_index, acc.is_main_process
        self._prepared = {}                             # id(module) -> (module, its prepared training wrapper)

    def gather(self, items: list) -> list:
        """Concatenate per-process lists in rank order."""
        if self.world == 1:
            return list(items)
        from accelerate.utils import gather_object
        return gather_object(list(items))

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum over processes (moved to the accelerator's device: NCCL cannot reduce CPU tensors)."""
        if self.world > 1:
            d = t.to(self.acc.device)
            torch.distributed.all_reduce(d, op=torch.distributed.ReduceOp.SUM)
            t.copy_(d)
        return t

    def any(self, flag: bool) -> bool:
        """True on every process if it is true on one (Ctrl-C must stop all processes at the same step)."""
        return bool(self.sum_(torch.tensor([float(flag)]))[0] > 0) if self.world > 1 else flag

    @property
    def fsdp(self) -> bool:
        """FSDP2 through accelerate (`accelerate launch --use_fsdp --fsdp_version 2`, or its config file)."""
        return self.world > 1 and bool(getattr(self.acc, "is_fsdp2", False))

    @property
    def share_prefix(self) -> bool:
        """Whether the update's forwards (and prepare_batch's no-grad passes, which must take the same path so the
        first PPO ratio is exactly 1) encode a micro-batch's common prefix once (policy.hidden_states). Not under
        FSDP: prefix sharing calls the backbone twice for some micro-batches and once for others, and FSDP's backward
        hooks (re-shard, reduce-scatter) fire per call of a unit, so the processes' collectives would differ."""
        return not self.fsdp

    def prepared(self, module: torch.nn.Module, wrap=None, optimizer=None) -> torch.nn.Module:
        """The module the update trains through: `wrap(module)` (or `module`) prepared by `accelerate`; the plain
        module in one process. DDP: gradients are all-reduced in the backward of a mini-batch's last micro-batch.
        FSDP2: prepared together with its optimizer (accelerate swaps the optimizer's parameters for the shards);
        `module`'s parameters become shards, gathered back whole between updates (`full_weights`). Made once per
        module, on every process at the same point (the constructors are collectives)."""
        if id(module) not in self._prepared:
            m = wrap(module) if wrap else module
            if self.world == 1:
                pm = m
            elif self.fsdp:
                if optimizer is None:
                    raise ValueError("FSDP prepares a module together with its optimizer")
                pm = self.acc.prepare(m, optimizer)[0]
                # fix `pm` as the root now (FSDP otherwise picks the first unit to run forward: the rollout would
                # call the inner model's units first); torch 2.13 has no public call for it
                from torch.distributed.fsdp import fully_shard
                fully_shard.state(pm)._lazy_init()
            else:
                pm = self.acc.prepare(m)
            self._prepared[id(module)] = (module, pm)
            self.full_weights(module)
        return self._prepared[id(module)][1]

    def _fsdp_units(self, module):
        from torch.distributed.fsdp import FSDPModule
        pm = self._prepared.get(id(module), (None, None))[1]
        return [u for u in pm.modules() if isinstance(u, FSDPModule)] if self.fsdp and pm is not None else []

    def full_weights(self, module: torch.nn.Module) -> None:
        """FSDP2: gather every shard of `module` (one all-gather per unit, on every process) and keep the whole
        weights (no re-sharding after a forward) until the next update starts (`reshard`), so the rollout, the MI
        proxy and the no-grad passes run on each process alone, with no collective per forward. A no-op otherwise."""
        for unit in self._fsdp_units(module):
            unit.set_reshard_after_forward(False)
            unit.unshard()

    def reshard(self, module: torch.nn.Module) -> None:
        """FSDP2: every unit of `module` back to its shards, FSDP's per-iteration records cleared
        (`reset_iter_state` on the root). FSDP records every forward for its backward prefetch; the forwards outside
        the update (rollout, no-grad passes) differ between processes, so each update starts from this state on
        every process. A no-op otherwise."""
        if self.fsdp and id(module) in self._prepared:
            self._prepared[id(module)][1].reset_iter_state()

    @contextlib.contextmanager
    def sharded(self, module: torch.nn.Module):
        """FSDP2: `module` with its shards registered (what torch's state-dict functions expect), whole again after.
        A no-op otherwise."""
        self.reshard(module)
        try:
            yield
        finally:
            self.full_weights(module)

    def no_sync(self, module: torch.nn.Module, skip: bool):
        """Gradient accumulation without communication (`accelerate.no_sync`) when `skip`; else a no-op."""
        return self.acc.no_sync(module) if skip and self.world > 1 else contextlib.nullcontext()


CPU_FSDP_ENV = "NANORAGEN_CPU_FSDP"


def make_accelerator(cpu: bool, log_with=None, project_dir=None):
    """accelerate's Accelerator. With NANORAGEN_CPU_FSDP=1 in the environment (CPU processes under torchrun): its
    FSDP2 path, which accelerate itself only selects on GPUs (on CPU its FSDP settings are ignored and DDP is used);
    torch's fully_shard runs on CPU with gloo, so the FSDP code path can be tested without a GPU. accelerate's own
    mixed precision is refused (one line) and set to "no": `policy.autocast` alone decides precision.
    project_dir (the run directory): trackers that write files (tensorboard) write under <project_dir>/trackers/."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    asked = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").lower()  # accelerate config / launch --mixed_precision
    if asked != "no":
        raise config.UsageError(f"accelerate mixed_precision={asked} is refused: precision has one owner here, --bf16 / "
                                "--no-bf16 (policy.autocast); set mixed_precision: no (accelerate config) or unset "
                                "ACCELERATE_MIXED_PRECISION")
    # mixed precision off: accelerate would autocast the prepared module's forward only (the update with N processes)
    # but not the no-grad passes that compute old log-probs, so the first PPO ratio would no longer be exactly 1.
    from accelerate.utils import ProjectConfiguration
    project = ProjectConfiguration(project_dir=str(project_dir), logging_dir=str(Path(project_dir) / "trackers")) \
        if project_dir is not None else None
    acc = Accelerator(cpu=cpu, log_with=log_with, mixed_precision="no", project_config=project)
    if os.environ.get(CPU_FSDP_ENV) == "1" and acc.num_processes > 1:
        from accelerate.state import PartialState
        acc.state.fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2,
                                                               auto_wrap_policy="transformer_based_wrap")
        acc.state.distributed_type = DistributedType.FSDP          # both shared states, as accelerate itself does
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return acc


def check_world(args, dist: "Dist") -> None:
    """Groups are sharded whole across processes; what FSDP does not support is refused before any compute."""
    if args.groups % dist.world:
        raise ValueError(f"--groups {args.groups} must be divisible by the number of processes ({dist.world})")
    from accelerate.utils import DistributedType
    if dist.world > 1 and dist.acc.distributed_type == DistributedType.FSDP and not dist.fsdp:
        raise config.UsageError("FSDP version 1 is not supported: set fsdp_version: 2 (accelerate config) or "
                                "--fsdp_version 2 (accelerate launch)")
    if dist.fsdp and args.grad_analysis_every:
        raise config.UsageError("--grad-analysis-every needs the whole gradients on every process: use it without "
                                "FSDP (one process or DDP)")
    if dist.fsdp and args.lora_rank:
        raise config.UsageError("--lora-rank is not supported under FSDP (the critic and the KL reference share the "
                                "policy's frozen base weights, which FSDP would replace by shards): use DDP")
    if dist.fsdp and args.rollout_backend != "hf":
        raise config.UsageError(f"--rollout-backend {args.rollout_backend} is not supported under FSDP (use hf)")


def fsdp_state(module, opt, dist: Dist, load: tuple | None = None):
    """FSDP2: the whole state dicts of `module` and its optimizer, gathered onto rank 0 (torch's
    torch.distributed.checkpoint.state_dict functions; the other ranks get empty ones), or with `load` = (model
    state, optimizer state) the inverse: rank 0's tensors broadcast and re-sharded. Every process calls it."""
    from torch.distributed.checkpoint import state_dict as dcp
    with dist.sharded(module):
        if load is None:
            return dcp.get_state_dict(module, opt, options=dcp.StateDictOptions(full_state_dict=True, cpu_offload=True))
        options = dcp.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        # two calls: set_state_dict skips the model on a rank whose model dict is empty (all but rank 0), and the
        # broadcast of rank 0's tensors would then wait forever
        dcp.set_model_state_dict(module, load[0], options=options)
        dcp.set_optimizer_state_dict(module, opt, load[1], options=options)
