"""Branches: a head's own copy of the encoder's top layers, run on the shared trunk's hidden
states at its split layer; and the trunk run only up to the deepest layer asked for.

Both are the checkpoint's own transformers model with its layer list cut: the branch keeps
layers `split..L-1` (its own copies) and whatever the family runs after them (ModernBERT's
final norm, DeBERTa's relative position embeddings), its embeddings replaced by `Given`, which
hands on the states it is passed as `inputs_embeds`; the trunk's lower part keeps layers
`0..k-1` (the same modules, shared). So the model's own attention mask, position and relative
position machinery runs in both, for every family, without code of its own here.
"""

from __future__ import annotations

import copy
import inspect

import torch
from torch import nn

from bertheads.base.errors import UserError

# Modules a family runs once after the last layer (the lower part of the trunk skips them) and
# after its first layer only (a branch that starts above layer 0 drops them).
AFTER_LAST = {"modernbert": ("final_norm",)}
AFTER_FIRST = {"deberta-v2": ("encoder.conv",)}


def layer_list(model: nn.Module) -> str:
    """The dotted name of the model's list of Transformer layers (the one `nn.ModuleList` of
    `num_hidden_layers` entries)."""
    count = int(getattr(model.config, "num_hidden_layers", getattr(model.config, "n_layers", 0)))
    found = [name for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == count and name]
    if len(found) != 1:
        raise UserError(f"{model.config.model_type}: cannot find its list of {count} layers, so it cannot branch")
    return found[0]


def replace(model: nn.Module, path: str, value: nn.Module | None) -> None:
    parent, _, last = path.rpartition(".")
    holder = model.get_submodule(parent) if parent else model
    if last in holder._modules:
        holder._modules[last] = value


class Given(nn.Module):
    """Stands for a model's embeddings: returns the `inputs_embeds` it is called with."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.signature = inspect.signature(embeddings.forward)

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.signature.bind_partial(*args, **kwargs).arguments["inputs_embeds"]


class Branch(nn.Module):
    """Layers `split..L-1` of a checkpoint's encoder (and what its family runs after them) as a
    module of their own: `forward(states, batch)` takes the trunk's hidden states at layer
    `split` and returns the last layer's."""

    def __init__(self, config, split: int) -> None:
        from transformers import AutoModel

        super().__init__()
        model = AutoModel.from_config(copy.deepcopy(config))
        count = int(getattr(config, "num_hidden_layers", getattr(config, "n_layers", 0)))
        if not 0 <= split < count:
            raise UserError(f"a branch starts at a layer 0..{count - 1}, not {split}")
        path = layer_list(model)
        replace(model, path, nn.ModuleList(list(model.get_submodule(path))[split:]))
        model.embeddings = Given(model.embeddings)
        if "pooler" in model._modules:  # (a head's, as `pretrained.take_pooler` has it)
            model.pooler = None
        if "embeddings_project" in model._modules:  # (it reads the embeddings, which the branch has not)
            del model._modules["embeddings_project"]
        if split > 0:
            for name in AFTER_FIRST.get(config.model_type, ()):
                replace(model, name, None)
        self.model = model
        self.split = split
        self.layers_at = path

    def encoder_key(self, key: str) -> str:
        """Where the branch's weight `key` is in the whole encoder (its layers counted from the split)."""
        path = self.layers_at
        if key.startswith(path + "."):
            index, _, rest = key[len(path) + 1:].partition(".")
            return f"{path}.{int(index) + self.split}.{rest}"
        return key

    def encoder_state(self) -> dict[str, torch.Tensor]:
        """The branch's weights named as the whole encoder's (what replaces the top layers there)."""
        return {self.encoder_key(k): v for k, v in self.model.state_dict().items()}

    def start_from(self, trunk: nn.Module) -> Branch:
        """Copy the trunk's own weights of the layers (and the modules after them) into the branch."""
        theirs = trunk.state_dict()
        mapped = {key: theirs[self.encoder_key(key)] for key in self.model.state_dict()
                  if self.encoder_key(key) in theirs}
        missing = sorted(set(self.model.state_dict()) - set(mapped))
        if missing:
            raise UserError(f"a branch's weights not in the checkpoint: {', '.join(missing[:3])}")
        self.model.load_state_dict(mapped)
        return self

    def check(self, trunk: nn.Module, tolerance: float = 1e-4) -> None:
        """Refuse (one line) a checkpoint whose top layers the branch does not compute as its own
        model does: the trunk up to the split, then the branch, against the whole model, on a
        check batch (one input padded), before anything is trained."""
        vocab = int(getattr(trunk.config, "vocab_size", 100))
        ids = torch.randint(min(5, vocab - 1), vocab, (2, 8), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        mask[1, 5:] = 0
        modes = [(m, m.training) for m in (trunk, self)]
        try:
            trunk.eval(), self.eval()
            with torch.no_grad():
                whole = trunk(input_ids=ids, attention_mask=mask).last_hidden_state
                lower = lower_part(trunk, max(self.split, 1))(input_ids=ids, attention_mask=mask,
                                                              output_hidden_states=True)
                got = self(lower.hidden_states[self.split], {"attention_mask": mask})
        finally:
            for module, training in modes:
                module.train(training)
        keep = mask.bool()
        difference = float((got[keep] - whole[keep]).abs().max())
        if not difference <= tolerance:
            raise UserError(f"{trunk.config.model_type}: its top layers run apart from the ones below differ from "
                            f"the whole model by {difference:.1e}, so its heads cannot have their own (tune_layers)")

    def forward(self, states: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = batch["attention_mask"]
        return self.model(inputs_embeds=states.to(next(self.parameters()).dtype), attention_mask=mask,
                          return_dict=True).last_hidden_state


def lower_part(model: nn.Module, count: int) -> nn.Module:
    """The model running its embeddings and first `count` layers only (the same modules, not
    copies), nothing after them: its hidden states 0..count are the full model's."""
    try:  # transformers records hidden states by hooks it installs on first use, once per model: on the
        # whole model here, so that the part (which shares its modules and that mark) does not install its own
        from transformers.utils.output_capturing import maybe_install_capturing_hooks

        maybe_install_capturing_hooks(model)
    except ImportError:  # (versions that collect them in the layers' loop)
        pass
    path = layer_list(model)
    lower = copy.copy(model)
    lower._modules = dict(model._modules)
    holder, parts = lower, path.split(".")
    for part in parts[:-1]:  # a copy of each module on the way to the layer list, so the model is untouched
        child = copy.copy(holder._modules[part])
        child._modules = dict(child._modules)
        holder._modules[part] = child
        holder = child
    holder._modules[parts[-1]] = nn.ModuleList(list(model.get_submodule(path))[:count])
    for name in AFTER_LAST.get(model.config.model_type, ()):
        replace(lower, name, nn.Identity())
    return lower
