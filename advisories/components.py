"""The NVIDIA components a GPU node runs, as bulletins name them: a registry, not a schema.

Each `Component` says how a bulletin's product row is recognised (words in its product name or
architecture), which inventory component it matches (`NodeComponent.component`), and what tells
one product's rows from another's (`scope`): a VBIOS row is for one GPU model, a system firmware
or BMC row for one platform (DGX A100, DGX H100, HGX ...), so the firmware of one product never
matches another's. A new component is one `register(Component(...))` here: ranges and exposures
carry the component as text, so it needs no migration.

Node facts used by scopes and conditions (`gpu_architecture`, `platform`, `container_toolkit_mode`)
come from the inventory (`Node.facts`, reported by the sources); the GPU architecture falls back
to the one the GPU model implies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Scopes: which node fact tells this component's products apart.
SCOPE_GPU_MODEL = "gpu_model"
SCOPE_PLATFORM = "platform"


@dataclass(frozen=True)
class Component:
    name: str  # inventory component name
    label: str
    words: tuple[str, ...]  # lower-case words of a product name (or architecture) that name it
    scope: str = ""  # SCOPE_GPU_MODEL, SCOPE_PLATFORM or "" (one product)
    exclude: tuple[str, ...] = ()  # words that make a product name *not* this component


REGISTRY: list[Component] = []


def register(component: Component) -> Component:
    if any(c.name == component.name for c in REGISTRY):
        raise ValueError(f"component {component.name!r} is registered twice")
    REGISTRY.append(component)
    return component


# Order matters: the first whose words match wins ("DGX A100 BMC" is a BMC, not system firmware;
# "NVSwitch firmware" is not the generic firmware; "CUDA Toolkit" is not the Container Toolkit).
register(Component("vbios", "VBIOS", ("vbios", "video bios"), scope=SCOPE_GPU_MODEL))
register(Component("bmc", "BMC firmware", ("bmc", "baseboard management"), scope=SCOPE_PLATFORM))
register(Component("nvswitch_firmware", "NVSwitch / NVLink firmware", ("nvswitch", "nvlink switch", "nvlink firmware")))
register(Component("fabric_manager", "Fabric Manager", ("fabric manager",)))
register(Component("container_toolkit", "NVIDIA Container Toolkit", ("container toolkit",)))
register(Component("cuda_toolkit", "CUDA Toolkit", ("cuda toolkit",)))
register(Component("gpu_operator", "NVIDIA GPU Operator", ("gpu operator",)))
# DCGM Exporter is its own product (its own versions, "3.3.9-3.6.1"): before DCGM, whose words it contains.
register(Component("dcgm_exporter", "DCGM Exporter", ("dcgm exporter", "dcgm-exporter")))
register(Component("dcgm", "DCGM", ("dcgm", "data center gpu manager")))
register(Component("triton", "Triton Inference Server", ("triton",)))
register(Component("tensorrt_llm", "TensorRT-LLM", ("tensorrt-llm", "tensorrt llm")))
register(Component("nim", "NVIDIA NIM", ("nim ", "nim for", "nvidia nim")))
# NeMo Framework; NeMo Guardrails, Curator and the Nemotron models are other products (review items).
register(Component("nemo", "NVIDIA NeMo", (" nemo ", " nemo-", "nemo framework", "nemo toolkit"),
                   exclude=("guardrails", "curator", "nemotron", "nemo retriever", "nemo microservice")))
register(Component("dynamo", "NVIDIA Dynamo", ("dynamo",)))
register(Component("doca", "NVIDIA DOCA", (" doca", "bluefield doca")))
register(Component("mlnx_ofed", "MLNX_OFED", ("mlnx_ofed", "mlnx ofed", "mlnx-ofed", "mellanox ofed", "ofed")))
register(Component("base_command_manager", "Base Command Manager", ("base command manager", "bright cluster manager")))
register(Component("system_firmware", "System firmware", ("dgx", "hgx", "system firmware", "sbios"),
                   scope=SCOPE_PLATFORM, exclude=("dgx os", "dgx cloud")))
register(Component("driver", "GPU driver", ("tesla", "geforce", "quadro", "rtx", "nvs", "studio", "guest driver",
                                              "virtual gpu manager", "cloud gaming", "display driver")))

DRIVER = "driver"


def classify(product_name: str, architecture: str = "") -> Component | None:
    """The component a product row belongs to; None when no registered component names it."""
    name = f" {product_name.lower()} "
    for component in REGISTRY:
        if any(word in name for word in component.exclude):
            continue
        if any(word in name for word in component.words):
            return component
    # Some bulletins name the product only in the architecture ("DGX A100" / "NVIDIA Product").
    arch = f" {architecture.lower()} "
    for component in REGISTRY:
        if component.scope == SCOPE_PLATFORM and any(word in arch for word in component.words):
            return component
    return None


def by_name(name: str) -> Component | None:
    return next((c for c in REGISTRY if c.name == name), None)


def slug(text: str) -> str:
    """'DGX A100' -> 'dgx_a100'; how platforms and GPU models compare."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


_GPU_MODEL = re.compile(r"\b((?:gb|gh)?\d{3}|[a-z]{1,2}\d{1,3}[a-z]?)\b")
# GPU model codes (as in "NVIDIA H100 80GB HBM3") and the architecture each belongs to.
ARCHITECTURES: dict[str, str] = {
    "m10": "maxwell", "m40": "maxwell", "m60": "maxwell",
    "p4": "pascal", "p40": "pascal", "p100": "pascal",
    "v100": "volta", "v100s": "volta", "t4": "turing",
    "a2": "ampere", "a10": "ampere", "a16": "ampere", "a30": "ampere", "a40": "ampere", "a100": "ampere",
    "a800": "ampere", "l4": "ada", "l20": "ada", "l40": "ada", "l40s": "ada",
    "h100": "hopper", "h200": "hopper", "h800": "hopper", "h20": "hopper", "gh200": "hopper",
    "b100": "blackwell", "b200": "blackwell", "b300": "blackwell", "gb200": "blackwell", "gb300": "blackwell",
}
ARCHITECTURE_NAMES = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")


def gpu_models(text: str) -> list[str]:
    """GPU model codes named in a product or node text: 'NVIDIA H100 80GB HBM3' -> ['h100']."""
    return [m for m in _GPU_MODEL.findall(text.lower()) if m in ARCHITECTURES]


def architecture_of(gpu_model: str) -> str:
    """The GPU architecture a node's GPU model implies; '' when the model is not known."""
    models = gpu_models(gpu_model)
    return ARCHITECTURES[models[0]] if models else ""


def platform_of(text: str) -> str:
    """A platform named in a product row: 'NVIDIA DGX A100' -> 'dgx_a100', 'HGX H100 8-GPU' -> 'hgx_h100'."""
    m = re.search(r"\b(dgx|hgx|igx)[\s_-]*((?:gb|gh)?[a-z]?\d{1,3}[a-z]?|spark|station)?", text.lower())
    if not m:
        return ""
    return slug(" ".join(part for part in m.groups() if part))
