"""TorchTPU's own tests of its Python surface, its guide's notebooks and their helper
(``docs/notebooks/tpu_utils.py`` at each version), run here as written, from TorchTPU's
repository: ``TORCHTPU_REPO`` names a checkout of it or its bare git directory (what the
``fetch`` of a public repository gives; with one, the helper runs at every version its history
holds). Nothing of TorchTPU's is kept in this repository, so without it these tests skip (CI has
no network); docs/torchtpu_compat.md's table says which of TorchTPU's tests run and why the
others cannot.

Each test file runs as ``python <file>`` (absltest's main) from a folder of its own that holds the
file and TorchTPU's ``tests`` package (their helpers, ``from tests import seed_test_utils``), not
the repository's root: there ``import torch_tpu`` would find TorchTPU's sources, whose native
extensions are not here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO_ENV = "TORCHTPU_REPO"

#: TorchTPU's test files of the Python surface that need no TPU: each runs, as written
RUN_AS_WRITTEN = (
    "tests/api/api_test.py",
    "torch_tpu/api/device_module_test.py",
    "torch_tpu/api/tpu_module_test.py",
    "tests/defer_never_test.py",
    "tests/compile/debug_test.py",
    "tests/pallas/pallas_signature_test.py",
    "tests/profiler/profiler_api_test.py",
    "torch_tpu/_internal/distributed/launchers/multihost_wrapper_test.py",
)
#: the guide's notebooks' own tests (pytest), which need no TPU either (the distributed one
#: starts four ranks with torchrun and trains DDP over the ``tpu_dist`` backend); the others take
#: a ``device`` or ``setup_sys_path`` fixture from a conftest.py TorchTPU's repository does not hold
NOTEBOOK_TESTS = ("docs/notebooks/tests/test_eager_mode.py", "docs/notebooks/tests/test_distributed_training_101.py")
#: the folders a bare git directory's snapshot is read from
_PATHS = ("tests", "docs/notebooks", "torch_tpu/api", "torch_tpu/_internal/distributed/launchers")
HELPER = "docs/notebooks/tpu_utils.py"


def _git(git_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, check=True)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, Path | None]:
    """(a checkout of TorchTPU's repository, its git directory or None)."""
    where = os.environ.get(REPO_ENV)
    if not where or not Path(where).exists():
        pytest.skip(f"TorchTPU's repository is not here: set {REPO_ENV} to a checkout of it or to its bare git "
                    "directory (CI has no network, so these run where it is fetched)")
    where = Path(where)
    if (where / "objects").is_dir() and (where / "HEAD").is_file():  # a bare git directory
        out = tmp_path_factory.mktemp("torchtpu_checkout")
        present = [p for p in _PATHS if _git(where, "ls-tree", "HEAD", p).stdout]
        archive = out / "snapshot.tar"
        archive.write_bytes(_git(where, "archive", "HEAD", *present).stdout)
        with tarfile.open(archive) as tar:
            tar.extractall(out, filter="data")
        return out, where
    return where, (where / ".git" if (where / ".git").is_dir() else None)


def _env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_DEBUG_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return env


def _folder_for(root: Path, relative: str, tmp_path: Path) -> Path:
    """A folder holding the file and TorchTPU's ``tests`` package, without its ``torch_tpu``."""
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(root / relative, folder / Path(relative).name)
    if (root / "tests").is_dir():
        (folder / "tests").symlink_to(root / "tests", target_is_directory=True)
    return folder


def _present(repo, relative: str, tmp_path: Path) -> Path:
    """The folder ``relative`` runs in, or a skip when this version of the repository lacks it."""
    root, _git_dir = repo
    if not (root / relative).exists():
        pytest.skip(f"{relative} is not in this version of TorchTPU's repository")
    return _folder_for(root, relative, tmp_path)


@pytest.mark.parametrize("relative", RUN_AS_WRITTEN)
def test_torchtpus_test_runs_as_written(repo, relative, tmp_path):
    folder = _present(repo, relative, tmp_path)
    done = subprocess.run([sys.executable, Path(relative).name], cwd=folder, env=_env(folder), capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0 and "\nOK" in done.stderr, done.stderr[-4000:]


@pytest.mark.parametrize("relative", NOTEBOOK_TESTS)
def test_the_notebooks_tests_run_as_written(repo, relative, tmp_path):
    folder = _present(repo, relative, tmp_path)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
                           Path(relative).name], cwd=folder, env=_env(folder), capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def _helper_versions(root: Path, git_dir: Path | None, tmp_path: Path) -> list[tuple[str, Path]]:
    """(version, file) for the notebook helper at each commit of the history that changed it
    (the checkout's own file without a history)."""
    if git_dir is None:
        return [("checkout", root / HELPER)] if (root / HELPER).exists() else []
    commits = _git(git_dir, "log", "--format=%H", "--all", "--", HELPER).stdout.decode().split()
    versions = []
    for commit in commits:
        shown = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{HELPER}"], capture_output=True,
                               check=False)
        if shown.returncode == 0:
            path = tmp_path / commit[:10] / "tpu_utils.py"
            path.parent.mkdir(parents=True)
            path.write_bytes(shown.stdout)
            versions.append((commit[:10], path))
    return versions


# what the guide's notebooks do with the helper: start the runtime, use the device, reset it
# (safe_shutdown, as a notebook switching kernels does) and start it again
_DRIVER = """
import torch, tpu_utils
device = tpu_utils.safe_init()
assert (torch.ones(3, device=device) * 2).sum().item() == 6.0
tpu_utils.safe_shutdown()
device = tpu_utils.safe_init()
assert torch.arange(4.0, device=device).sum().item() == 6.0
print("helper ok")
"""


@pytest.mark.parametrize("runner", ["python", "tpu-debug run"])
def test_the_notebook_helper_runs_at_each_version(repo, runner, tmp_path):
    root, git_dir = repo
    versions = _helper_versions(root, git_dir, tmp_path)
    if not versions:
        pytest.skip(f"{HELPER} is not in this version of TorchTPU's repository")
    for version, helper in versions:
        (helper.parent / "driver.py").write_text(_DRIVER)
        command = [sys.executable] + (["-m", "tpu_debug", "run", "--logdir", str(tmp_path / "runs")]
                                      if runner != "python" else []) + ["driver.py"]
        done = subprocess.run(command, cwd=helper.parent, env=_env(helper.parent), capture_output=True, text=True,
                              timeout=600, check=False)
        assert done.returncode == 0 and "helper ok" in done.stdout, f"{version}:\n{done.stderr[-3000:]}"


def _notebooks(root: Path) -> list[Path]:
    folder = root / "docs" / "notebooks"
    return sorted(p for p in folder.glob("*.py") if p.name != "tpu_utils.py" and "marimo.App" in p.read_text())


@pytest.mark.parametrize("runner", ["python", "tpu-debug run"])
def test_the_notebooks_run_unchanged(repo, runner, tmp_path):
    pytest.importorskip("marimo", reason="the guide's notebooks are marimo apps: pip install marimo")
    root, _git_dir = repo
    notebooks = [p for p in _notebooks(root) if p.stem not in CANNOT_RUN]
    if not notebooks:
        pytest.skip("no notebooks in this version of TorchTPU's repository")
    failed = []
    for notebook in notebooks:
        command = [sys.executable] + (["-m", "tpu_debug", "run", "--logdir", str(tmp_path / "runs")]
                                      if runner != "python" else []) + [notebook.name]
        done = subprocess.run(command, cwd=notebook.parent, env=_env(notebook.parent), capture_output=True,
                              text=True, timeout=1800, check=False)
        if done.returncode != 0:
            failed.append(f"{notebook.name}: {done.stderr[-1500:]}")
    assert not failed, "\n".join(failed)


#: notebooks that cannot run here, and why (docs/torchtpu_compat.md says the same)
CANNOT_RUN = {
    "porting_vit_mnist": "downloads MNIST with scikit-learn's fetch_openml (and plots with matplotlib)",
}


# -- projects built on TorchTPU, from their repositories ---------------------------------------------

def _files_from(env: str, paths: tuple[str, ...], tmp_path: Path, *, touching: str) -> Path:
    """A folder holding ``paths`` of the repository ``env`` names (a checkout, or a bare git
    directory: at the newest commit of its history that holds ``touching``)."""
    where = os.environ.get(env)
    if not where or not Path(where).exists():
        pytest.skip(f"the repository is not here: set {env} to a checkout of it or to its bare git directory")
    where = Path(where)
    if not ((where / "objects").is_dir() and (where / "HEAD").is_file()):
        return where
    commits = _git(where, "log", "--all", "--format=%H", "--", touching).stdout.decode().split()
    held = [c for c in commits if _git(where, "ls-tree", c, touching).stdout]
    if not held:
        pytest.skip(f"no commit of {where} holds {touching}")
    out = tmp_path / "checkout"
    out.mkdir()
    archive = out / "snapshot.tar"
    archive.write_bytes(_git(where, "archive", held[0], *paths).stdout)
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    return out


def _stand_in_packages(root: Path, *names: str) -> None:
    """Empty packages over ``root``'s folders, so one module of a project imports without its
    package's ``__init__`` (which pulls in the rest of the project and its dependencies)."""
    import types

    for name in names:
        module = types.ModuleType(name)
        module.__path__ = [str(root.joinpath(*name.split(".")))]
        sys.modules[name] = module


TOKAMAX_OP = "tokamax/_src/ops/linear_softmax_cross_entropy_loss"


def test_tokamax_torch_op_runs_from_its_repository(tmp_path, monkeypatch):
    # tokamax's TorchTPU op (its Mosaic TPU kernels registered through
    # torch_tpu._internal.pallas.pallas.jax_op), forward and backward, against PyTorch on CPU
    pytest.importorskip("jaxtyping", reason="tokamax's kernels annotate with jaxtyping: pip install jaxtyping")
    import torch

    root = _files_from("TOKAMAX_REPO", (TOKAMAX_OP,), tmp_path, touching=f"{TOKAMAX_OP}/torch_api.py")
    for name in [n for n in sys.modules if n == "tokamax" or n.startswith("tokamax.")]:
        monkeypatch.delitem(sys.modules, name)
    _stand_in_packages(root, "tokamax", "tokamax._src", "tokamax._src.ops",
                       "tokamax._src.ops.linear_softmax_cross_entropy_loss")
    from tokamax._src.ops.linear_softmax_cross_entropy_loss import torch_api

    torch.manual_seed(0)
    x, w = torch.randn(32, 128), torch.randn(128, 256)
    labels = torch.randint(0, 256, (32,), dtype=torch.int32)
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    loss, lse = torch_api.linear_softmax_cross_entropy_loss(xt, labels.to("tpu"), wt, 32, 128, 128, "mean", "float32")
    loss.backward()
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    expected = torch.nn.functional.cross_entropy(xc @ wc, labels.long())
    expected.backward()
    torch.testing.assert_close(loss.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.detach().cpu(), torch.logsumexp(x @ w, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-5)


TPU_SYNC_LOADER = "tpu_sync/api/torch/torch_tpu_common_loader.py"
TPU_SYNC_ABI = "tpu_sync/api/torch/torch_abi.py"


def test_tpu_sync_loader_runs_from_its_repository(tmp_path, monkeypatch):
    # tpu-sync loads TorchTPU, then opens its native library beside torch_tpu.__file__ if there:
    # here there is none, which the loader takes as nothing to open
    import warnings

    root = _files_from("TPU_SYNC_REPO", (TPU_SYNC_LOADER, TPU_SYNC_ABI), tmp_path, touching=TPU_SYNC_LOADER)
    for name in [n for n in sys.modules if n == "tpu_sync" or n.startswith("tpu_sync.")]:
        monkeypatch.delitem(sys.modules, name)
    _stand_in_packages(root, "tpu_sync", "tpu_sync.api", "tpu_sync.api.torch")
    from tpu_sync.api.torch import torch_tpu_common_loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loader's one line: no native TorchTPU library here
        torch_tpu_common_loader.load_torch_tpu_common()
    assert torch_tpu_common_loader._LOADED
