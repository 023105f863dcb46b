"""A model folder on the Hugging Face Hub (the optional ``hub`` extra, huggingface-hub): `dchag
push-model` uploads a folder `dchag export` wrote, after loading it as `dchag predict` would;
`dchag pull-model` downloads one into a temporary folder beside the output, loads it the same
way and only then moves it into place, so a damaged or foreign download leaves nothing.

The Hub's token and endpoint are huggingface-hub's own settings (``HF_TOKEN`` or ``hf auth
login``, ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``); a network, authorisation or offline failure is
one line naming the repository.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..model.folder import META, WEIGHTS, ModelFolderError, load
from ..store import InputError, atomic_path


class HubError(InputError):
    pass


def _hub():
    try:
        import huggingface_hub
        import huggingface_hub.errors  # noqa: F401 - a lazy submodule
    except ImportError:
        raise HubError("pushing and pulling models needs the hub extra: pip install 'dchag[hub]'") from None
    return huggingface_hub


def _failed(what: str, repo_id: str, err: Exception) -> HubError:
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return HubError(f"{what} Hugging Face Hub repository {repo_id!r}: {type(err).__name__}: {first}")


def push(folder: str | Path, repo_id: str, revision: str | None = None, private: bool = False) -> str:
    """Upload the model folder ``folder`` (its weights and model.json) to the model repository
    ``repo_id``, created if absent; returns the commit's URL."""
    model = load(folder)  # only a model folder that loads is pushed
    hub = _hub()
    api = hub.HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            revision=revision,
            allow_patterns=[WEIGHTS, META],
            commit_message=f"dchag model ({model.meta['task']}) from {(model.meta.get('provenance') or {}).get('run')}",
        )
    except Exception as err:  # the library's and its HTTP client's: network, authorisation, validation
        raise _failed("cannot push to the", repo_id, err) from None
    return str(info.commit_url)


def pull(repo_id: str, output: str | Path, revision: str | None = None) -> Path:
    """Download the model folder of ``repo_id`` to ``output`` (a new directory, or one an earlier
    pull wrote), checked by loading it before it is moved into place."""
    hub = _hub()
    with atomic_path(output, "model") as tmp:
        try:
            hub.snapshot_download(repo_id, revision=revision, local_dir=tmp, allow_patterns=[WEIGHTS, META])
        except Exception as err:  # the library's and its HTTP client's: network, authorisation, validation
            raise _failed("cannot pull the", repo_id, err) from None
        for p in tmp.iterdir():  # the library's own download records
            if p.name not in (WEIGHTS, META):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        try:
            load(tmp)
        except ModelFolderError as err:
            raise HubError(f"the Hugging Face Hub repository {repo_id!r} holds no dchag model folder: {err}") from None
    return Path(output)
