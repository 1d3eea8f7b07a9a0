"""Patch methods: how a component gets its new version on this node.

- ``package``: the node's package manager through a command template (per component or one for
  all), e.g. ``apt-get install -y nvidia-driver-{branch}={version}``. The template is split into
  words before the values are filled in, so a version can never add words to the command.
- ``script``: a site script, run as ``<path> <component> <version>``.
- ``noop``: nothing to do here (Kubernetes nodes whose driver the GPU Operator manages).
- ``livepatch``: the running kernel's livepatch (component ``livepatch``, version the livepatch
  version wanted): ``canonical-livepatch refresh`` by default, or a configured ``command`` (a
  kpatch site script). It takes effect at once: no drain, no reboot.

Exact distribution packages: a patch may name the packages to install at exact versions
(``packages``: binary name -> version, from the distribution's advisory, e.g. every installed binary
of ``nvidia-graphics-drivers-570-server`` at ``570.172.08-0ubuntu0.22.04.1``). The ``package`` method
then runs its ``packages`` template, ``apt-get install -y --no-install-recommends {packages}`` on
dpkg nodes and ``dnf install -y {packages}`` on rpm nodes by default; the ``{packages}`` word becomes
one word per package, each written as ``package_format`` says (``{name}={version}`` for apt,
``{name}-{version}`` for dnf). A site overrides either in ``patch_methods.package`` (``commands``:
``{"packages": "..."}``, ``package_format``). The component ``packages`` (OS packages that are
neither the kernel nor the driver) needs no reboot: the new versions are in place at once.

Every method has a dry run that reports the command without running it. With ``simulate`` in a
method's options (test and demo nodes), the command is not run: the new version is recorded as
pending and becomes the node's fact at the (simulated) reboot.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Any

from .config import AgentConfig
from .packages import PackageError, get_package_manager
from .util import host_argv, import_string

VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+:~_-]{0,63}$")
COMPONENT_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# dpkg's package names, and rpm's (which may hold upper case and underscores).
PACKAGE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]{0,127}$")
MAX_PACKAGES = 500
# The component of OS packages that are neither the kernel nor the driver: updated in place, no reboot.
OS_PACKAGES = "packages"
# The exact packages' command and how each package is written in it, per package manager.
PACKAGES_TEMPLATES = {
    "dpkg": ("apt-get install -y --no-install-recommends {packages}", "{name}={version}"),
    "rpm": ("dnf install -y {packages}", "{name}-{version}"),
}
DEFAULT_TEMPLATES = {
    "driver": "apt-get install -y --no-install-recommends nvidia-driver-{branch}={version}",
    "container_toolkit": "apt-get install -y --no-install-recommends nvidia-container-toolkit={version}",
    "dcgm": "apt-get install -y --no-install-recommends datacenter-gpu-manager={version}",
    # The version is the kernel's release as uname -r prints it ("5.15.0-1073-nvidia"): its package's name.
    "kernel": "apt-get install -y --no-install-recommends linux-image-{version} linux-modules-{version}",
}


class PatchError(Exception):
    """The patch request is invalid or its command failed; the message names which."""


class PatchMethod:
    name = ""
    # Whether the new version takes effect only at the next reboot (a livepatch's at once).
    at_reboot = True

    def __init__(self, config: AgentConfig, options: dict[str, Any]) -> None:
        self.config = config
        self.options = options

    @property
    def simulate(self) -> bool:
        return bool(self.options.get("simulate"))

    def command(self, component: str, version: str, packages: dict[str, str] | None = None) -> list[str]:
        raise NotImplementedError

    def apply(self, component: str, version: str, packages: dict[str, str] | None = None) -> str:
        argv = self.command(component, version, packages)
        if not argv:
            return ""
        argv = host_argv(self.config, argv)
        try:
            timeout = float(self.options.get("timeout", 1800))
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PatchError(f"{self.name} patch of {component} to {version}: {shlex.join(argv)}: {exc}") from None
        output = (proc.stdout + proc.stderr)[-20_000:]
        if proc.returncode != 0:
            raise PatchError(
                f"{self.name} patch of {component} to {version}: {shlex.join(argv)} exited {proc.returncode}: "
                f"{output[-2000:]}"
            )
        return output


class PackagePatch(PatchMethod):
    name = "package"

    def _manager(self) -> str:
        """The node's package manager's name: which exact-packages command is the default."""
        try:
            found = get_package_manager(self.config)
        except PackageError:
            found = None
        return found.name if found is not None else "dpkg"

    def command(self, component: str, version: str, packages: dict[str, str] | None = None) -> list[str]:
        commands = self.options.get("commands", {})
        if packages:
            default, spec = PACKAGES_TEMPLATES.get(self._manager(), PACKAGES_TEMPLATES["dpkg"])
            template = commands.get("packages") or default
            spec = str(self.options.get("package_format") or spec)
        else:
            template = {**DEFAULT_TEMPLATES, **commands}.get(component) or self.options.get("command")
        if not template:
            raise PatchError(f"package patch: no command template for component {component!r}")
        values = {"component": component, "version": version, "branch": version.split(".")[0]}
        try:
            argv: list[str] = []
            for word in shlex.split(template):
                if word == "{packages}":  # one word per package: a version never adds words of its own
                    argv += [spec.format(name=n, version=v) for n, v in sorted((packages or {}).items())]
                else:
                    argv.append(word.format(**values, packages=""))
            return argv
        except (KeyError, ValueError, IndexError) as exc:
            raise PatchError(f"package patch: bad command template {template!r}: {exc}") from None


class ScriptPatch(PatchMethod):
    name = "script"

    def command(self, component: str, version: str, packages: dict[str, str] | None = None) -> list[str]:
        path = self.options.get("path")
        if not path:
            raise PatchError("script patch: no 'path' configured in patch_methods.script")
        # Exact packages follow as name=version words.
        return [str(path), component, version, *(f"{n}={v}" for n, v in sorted((packages or {}).items()))]


class NoopPatch(PatchMethod):
    """The component is managed elsewhere (the GPU Operator's driver pods); nothing runs here."""

    name = "noop"

    def command(self, component: str, version: str, packages: dict[str, str] | None = None) -> list[str]:
        return []


class LivepatchPatch(PatchMethod):
    """The livepatch service applies the fixes to the running kernel; its state is then read back
    (gpusweep_agent.osinfo.LivepatchProbe reports the version as the ``livepatch`` component)."""

    name = "livepatch"
    at_reboot = False

    def command(self, component: str, version: str, packages: dict[str, str] | None = None) -> list[str]:
        if component != "livepatch":
            raise PatchError(f"livepatch patch: only the livepatch component, not {component!r}")
        template = str(self.options.get("command", "canonical-livepatch refresh"))
        try:
            return [word.format(component=component, version=version) for word in shlex.split(template)]
        except (KeyError, ValueError) as exc:
            raise PatchError(f"livepatch patch: bad command template {template!r}: {exc}") from None


PATCH_METHODS = {
    "package": "gpusweep_agent.patch.PackagePatch",
    "script": "gpusweep_agent.patch.ScriptPatch",
    "noop": "gpusweep_agent.patch.NoopPatch",
    "livepatch": "gpusweep_agent.patch.LivepatchPatch",
}


def get_patch_method(name: str, config: AgentConfig) -> PatchMethod:
    options = dict(config.patch_methods.get(name, {}))
    dotted = options.pop("class", None) or PATCH_METHODS.get(name)
    if not dotted:
        raise PatchError(f"unknown patch method {name!r} (known: {', '.join(sorted(PATCH_METHODS))})")
    cls = import_string(dotted)
    if not (isinstance(cls, type) and issubclass(cls, PatchMethod)):
        raise PatchError(f"patch method {name!r}: {dotted} is not a PatchMethod")
    return cls(config, options)


def validate(component: str, version: str, packages: Any = None) -> None:
    if not COMPONENT_RE.match(component):
        raise PatchError(f"bad component name {component!r}")
    if not VERSION_RE.match(version):
        raise PatchError(f"bad version {version!r}")
    if packages is None:
        return
    if not isinstance(packages, dict) or len(packages) > MAX_PACKAGES:
        raise PatchError(f"packages: expected an object of at most {MAX_PACKAGES} name: version")
    for name, wanted in packages.items():
        if not isinstance(name, str) or not PACKAGE_NAME_RE.match(name):
            raise PatchError(f"packages: bad package name {name!r}")
        if not isinstance(wanted, str) or not VERSION_RE.match(wanted):
            raise PatchError(f"packages: bad version {wanted!r} of {name}")
