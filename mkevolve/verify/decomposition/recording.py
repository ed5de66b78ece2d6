"""What the top-level builds and calls, recorded while it runs: subproblem instances with their constructor
and forward arguments, what else the built Model holds, and the ATen ops run outside every subproblem."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mkevolve.verify.decomposition.signatures import Signature, bind


@dataclass
class Instance:
    name: str
    module: Any
    init: Signature | None
    calls: list[Signature | None] = field(default_factory=list)
    attribute: str = "?"


def subproblem_classes(top, problems_dir: Path) -> dict[type, str]:
    """Subproblem Model classes the top-level module bound, by the file they came from."""
    classes = {}
    for value in vars(top).values():
        if isinstance(value, type) and issubclass(value, nn.Module):
            module = sys.modules.get(value.__module__)
            origin = Path(getattr(module, "__file__", "") or "")
            if origin.parent.resolve() == problems_dir.resolve():
                classes[value] = origin.stem
    return classes


class RecordConstruction:
    """Records every construction of a subproblem class (arguments bound to its __init__) while active."""

    def __init__(self, classes: dict[type, str], sink: list[Instance]):
        self.classes = classes
        self.sink = sink
        self.saved: list[tuple[type, Any]] = []

    def __enter__(self) -> RecordConstruction:
        for cls, name in self.classes.items():
            self.saved.append((cls, cls.__dict__.get("__init__")))
            cls.__init__ = self._recording(cls, name, cls.__init__)
        return self

    def _recording(self, cls: type, name: str, original):
        sink = self.sink

        def init(module, *args, **kwargs):
            if type(module) is cls:
                sink.append(Instance(name, module, bind(original, args, kwargs, skip_self=True)))
            original(module, *args, **kwargs)

        return init

    def __exit__(self, *exc) -> None:
        for cls, own in self.saved:
            if own is None:
                del cls.__init__
            else:
                cls.__init__ = own


def structure_impurities(model, instances: list[Instance], classes: dict[type, str]) -> list[str]:
    """What the built top-level holds besides subproblem modules."""
    found = [f"Model registers its own parameter '{n}'; parameters belong in a subproblem"
             for n in model._parameters]
    found += [f"Model registers its own buffer '{n}'; buffers belong in a subproblem" for n in model._buffers]
    children = dict(model.named_children())
    for attribute, child in children.items():
        if type(child) not in classes:
            found.append(f"child module '{attribute}' is a {type(child).__module__}.{type(child).__qualname__}, "
                         "not a subproblem module; the top-level builds only subproblem modules")
    by_id = {id(child): attribute for attribute, child in children.items()}
    for instance in instances:
        instance.attribute = by_id.get(id(instance.module), "?")
        if instance.attribute == "?":
            found.append(f"a {instance.name} module is built but not stored as an attribute of Model "
                         "(self.<name> = ...); lists and dicts of modules are not allowed")
    return found


class RecordForward:
    """Forward hooks on every subproblem instance (their inputs), and the ATen ops run outside them."""

    def __init__(self, instances: list[Instance], ops: list[str]):
        self.instances = instances
        self.ops = ops
        self.handles = []
        self.mode = None

    def __enter__(self) -> RecordForward:
        ops = self.ops
        state = {"depth": 0}

        class OutsideSubproblems(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if state["depth"] == 0:
                    ops.append(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))

        for instance in self.instances:
            self.handles.append(instance.module.register_forward_pre_hook(
                self._pre_hook(instance, state), with_kwargs=True))
            self.handles.append(instance.module.register_forward_hook(self._post_hook(state)))
        self.mode = OutsideSubproblems()
        self.mode.__enter__()
        return self

    @staticmethod
    def _pre_hook(instance: Instance, state: dict):
        def hook(module, args, kwargs):
            instance.calls.append(bind(type(module).forward, tuple(args), dict(kwargs), skip_self=True))
            state["depth"] += 1

        return hook

    @staticmethod
    def _post_hook(state: dict):
        def hook(module, args, output):
            state["depth"] -= 1

        return hook

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)
        for handle in self.handles:
            handle.remove()
