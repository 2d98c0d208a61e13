"""Adversarial suite (issue 38, item 1): `linnet cache clear` loses no user byte.

$LINNET_HOME may point anywhere (a project, ``$HOME``, a link to a user's folder) and users
put files beside Linnet's. Every case writes Linnet's own files through Linnet's writers
(generated source, the timing cache, demo checkpoints, a file set aside) and torch's and
Triton's as they name them (by hashes), then the user's; then clears through the CLI. The
user's bytes (and links) must be exactly as they were, and Linnet's own files gone (or,
in a home Linnet did not make, the clear refused with E0745 and nothing touched).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from linnet.lang.cli import main
from linnet.torch import home as torch_home

INDUCTOR = (
    "cache/inductor/5a/c5au5a2mphshn5mjfphssnhp6upkood6f3jju32shuhiunzavhf6.so",
    "cache/inductor/locks/c5au5a2mphshn5mjfphssnhp6upkood6f3jju32shuhiunzavhf6.lock",
    "cache/inductor/fxgraph/kq/fkqp7ajgkubshpmvkfnngsxzjdmb4vxs5iebk6hwprxcinm7t3uy/"
    "auuk7hoo3nxn5a2o4mc7paimibqk5bskvwe4gjjsbmucd2pge5p",
)
TRITON = (
    "cache/triton/ALW3J5ZQ2MBTVU7DXFPD6NF5YF6U4DWDUBFHXVR6DCKHOG3A4JRA/"
    "triton_poi_fused_sin_0.cubin",
    "cache/triton/ALW3J5ZQ2MBTVU7DXFPD6NF5YF6U4DWDUBFHXVR6DCKHOG3A4JRA/"
    "__grp__triton_poi_fused_sin_0.json",
)
CACHE_FOLDERS = ("timings", "generated", "inductor", "triton", "unreadable", "demo")


@pytest.fixture(autouse=True)
def clean(monkeypatch, linnet_home):
    """No compile cache variable set (Linnet places the caches under the home)."""
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch_home, "_SET", {})
    monkeypatch.setattr(torch_home, "_MADE", set())
    monkeypatch.delenv("LINNET_DEBUG", raising=False)
    return linnet_home


def tree(root: Path) -> dict[str, object]:
    """Every file's bytes and every link's target under ``root`` (links not followed)."""
    out: dict[str, object] = {}
    if root.is_symlink():
        return {".": ("link", os.readlink(root))}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_file():
                out[rel] = path.read_bytes()
    return out


def user_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def safetensors_bytes(value: float = 1.0) -> bytes:
    import torch
    from safetensors.torch import save

    return save({"w": torch.full((2,), value)})


def linnet_writes(home: Path, tmp: Path) -> list[str]:
    """Linnet's own files in ``home`` (the current $LINNET_HOME), written as Linnet writes
    them; their paths under the home."""
    from linnet.lang.home import import_source
    from linnet.lang.host.run import demo_checkpoint
    from linnet.plan import TimingCache

    made = []
    for i in range(2):
        module = import_source(f"x = {i}\n", "linnet_adv")
        made.append(str(Path(module.__file__).relative_to(home)))
    cache = TimingCache()
    cache.put("k", 1.0)
    cache.flush()
    made.append("benchmarks.json")
    model = tmp / "adv.linnet"
    model.write_text("model")
    demo = demo_checkpoint(model, {"D": 4}, 0, lambda p: p.write_bytes(safetensors_bytes()))
    made.append(str(demo.relative_to(home)))
    for rel in INDUCTOR:
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_bytes(b"compiled")
        made.append(rel)
    kernel, group = (home / rel for rel in TRITON)  # as Triton writes a compilation
    kernel.parent.mkdir(parents=True, exist_ok=True)
    kernel.write_bytes(b"cubin")
    group.write_text(json.dumps({"child_paths": {kernel.name: str(kernel)}}))
    made += TRITON
    broken = (
        home
        / "cache"
        / "inductor"
        / "fxgraph"
        / "zz"
        / "fzzq7ajgkubshpmvkfnngsxzjdmb4vxs5iebk6hwprxcinm7t3uy"
    )
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a pickle")
    aside = torch_home._move_aside(broken, home / "cache" / "unreadable")
    assert aside is not None
    made.append(str(aside.relative_to(home)))
    return made


def clear(capsys, *args: str) -> tuple[int, str]:
    rc = main(["cache", "clear", *args])
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    return rc, text


def assert_cleared(home: Path, made: list[str]) -> None:
    left = [rel for rel in made if (home / rel).exists() or (home / rel).is_symlink()]
    assert not left, f"Linnet's own files not cleared: {left}"


# ---------------------------------------------------------------- a home of user files
USER_CONTENT = {
    "demo": {"demo/llama-0123456789ab.safetensors": b"my weights", "demo/notes.txt": b"n"},
    "generated": {"generated/model.py": b"print('mine')\n"},
    "inductor": {"cache/inductor/my-kernels/k.cpp": b"int main(){}"},
    "triton": {"cache/triton/tuned.json": b"{}"},
    "unreadable": {"cache/unreadable/report.pdf": b"%PDF"},
    "benchmarks": {"benchmarks.json": b'{"my": "benchmarks"}'},
    "corrupt": {"benchmarks.json.corrupt-2024": b"old results"},
}


@pytest.mark.parametrize("beside", [True, False], ids=["with-other-files", "alone"])
@pytest.mark.parametrize("kind", sorted(USER_CONTENT))
def test_a_home_of_user_files_loses_nothing(tmp_path, monkeypatch, capsys, kind, beside):
    project = tmp_path / "project"
    files = dict(USER_CONTENT[kind])
    if beside:
        files["README.md"] = b"# my project"
    user_tree(project, files)
    monkeypatch.setenv("LINNET_HOME", str(project))
    before = tree(project)
    rc, text = clear(capsys)
    if beside:  # not Linnet's home: refused, nothing touched
        assert rc == 1 and "E0745" in text and "README.md" in text
    else:  # only Linnet's names: an earlier version's home, adopted; the user's files kept
        assert rc == 0 and "marked" in text
    after = tree(project)
    after.pop("CACHEDIR.TAG", None)
    after.pop("linnet-files.jsonl", None)
    assert after == before


def test_home_as_linnet_home_is_refused_and_untouched(tmp_path, monkeypatch, capsys):
    home = user_tree(
        tmp_path / "me",
        {
            ".bashrc": b"export PATH",
            "Documents/thesis.tex": b"\\documentclass",
            "demo/talk.mp4": b"video",
            "generated/plots.py": b"import matplotlib",
            "cache/inductor/x.txt": b"x",
            "benchmarks.json": b'{"mine": 1}',
        },
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LINNET_HOME", str(home))
    made = linnet_writes(home, tmp_path)  # Linnet ran there too
    before = tree(home)
    rc, text = clear(capsys)
    assert rc == 1 and "E0745" in text and "not made by Linnet" in text
    assert tree(home) == before
    assert main(["cache"]) == 0
    assert "not Linnet's home" in capsys.readouterr().out
    assert all((home / rel).exists() for rel in made)  # refused: nothing removed at all


# ---------------------------------------------------------------- links
LINKS = [
    "demo",
    "generated",
    "cache",
    "cache/inductor",
    "cache/triton",
    "cache/unreadable",
    "cache/inductor/5a",
    "cache/triton/ALW3J5ZQ2MBTVU7DXFPD6NF5YF6U4DWDUBFHXVR6DCKHOG3A4JRA",
    "generated/sub",
]


@pytest.mark.parametrize("where", LINKS)
def test_a_link_to_a_user_folder_inside_the_home_is_not_followed(tmp_path, capsys, clean, where):
    made = linnet_writes(clean, tmp_path)
    # The user's folder holds files that Linnet's rules would take if they were followed.
    folder = user_tree(
        tmp_path / "mine",
        {
            "inductor/c5au5a2mphshn5mjfphssnhp6upkood6f3jju32shuhiunzavhf6.so": b"mine",
            "c7au5a2mphshn5mjfphssnhp6upkood6f3jju32shuhiunzavhf6.so": b"mine too",
            "triton_poi_fused_sin_0.cubin": b"cubin",
            "notes.txt": b"n",
        },
    )
    link = clean / where
    if link.exists():
        made = [m for m in made if not m.startswith(where + "/")]
        import shutil

        shutil.rmtree(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(folder, target_is_directory=True)
    before = tree(folder)
    rc, _ = clear(capsys)
    assert rc == 0
    assert tree(folder) == before
    assert link.is_symlink() and os.readlink(link) == str(folder)
    assert_cleared(clean, [m for m in made if not m.startswith(where)])


def test_links_to_user_files_in_linnet_folders_are_kept(tmp_path, capsys, clean):
    from linnet.lang.home import import_source

    made = linnet_writes(clean, tmp_path)
    text = "y = 2\n"
    module = import_source(text, "linnet_linked")
    path = Path(module.__file__)
    path.unlink()
    theirs = tmp_path / "theirs.py"
    theirs.write_text(text)  # the same content as the name's hash: still a link of theirs
    path.symlink_to(theirs)
    timing = tmp_path / "shared-benchmarks.json"
    timing.write_text(json.dumps({"format": "linnet.benchmarks", "version": 1, "entries": {}}))
    (clean / "benchmarks.json").unlink()
    (clean / "benchmarks.json").symlink_to(timing)
    made.remove("benchmarks.json")
    rc, _ = clear(capsys)
    assert rc == 0 and path.is_symlink() and (clean / "benchmarks.json").is_symlink()
    assert theirs.read_text() == text and "linnet.benchmarks" in timing.read_text()
    assert_cleared(clean, made)


@pytest.mark.parametrize("target", ["user", "empty", "linnet"])
def test_a_linked_home(tmp_path, monkeypatch, capsys, target):
    real = tmp_path / "real"
    if target == "user":
        user_tree(real, {"thesis.tex": b"\\begin", "demo/talk.mp4": b"video"})
    elif target == "empty":
        real.mkdir()
    else:  # an empty folder for Linnet, reached through a link: Linnet marks it on first use
        (tmp_path / "made").mkdir()
    link = tmp_path / "link"
    link.symlink_to(real if target != "linnet" else tmp_path / "made", True)
    monkeypatch.setenv("LINNET_HOME", str(link))
    if target == "linnet":  # Linnet made the home through the link
        made = linnet_writes(link, tmp_path)
        real = tmp_path / "made"
    before = tree(real)
    rc, text = clear(capsys)
    assert link.is_symlink()
    if target == "user":
        assert rc == 1 and "E0745" in text and tree(real) == before
    else:
        assert rc == 0
    if target == "linnet":
        assert_cleared(real, made)
        assert (real / "CACHEDIR.TAG").is_file()


# ---------------------------------------------------------------- beside Linnet's own
BESIDE = {
    "timings": ["benchmarks.json.corrupt-mine", "benchmarks.json.backup"],
    "generated": [
        "generated/notes.txt",
        # a generated name whose content the user edited: not what Linnet wrote
        "generated/linnet_adv_0123456789abcdef0123.py",
    ],
    "inductor": [
        "cache/inductor/notes.txt",
        "cache/inductor/5a/notes.txt",
        "cache/inductor/fxgraph/README",
    ],
    "triton": [
        "cache/triton/notes.txt",
        "cache/triton/ALW3J5ZQ2MBTVU7DXFPD6NF5YF6U4DWDUBFHXVR6DCKHOG3A4JRA/notes.txt",
    ],
    "unreadable": [
        "cache/unreadable/notes.txt",
        "cache/unreadable/20240101T000000-c5au5a2mphshn5mjfphssnhp6upkoo-abcd1234",
    ],
    "demo": ["demo/mine.safetensors", "demo/llama-0123456789ab.safetensors"],
}


@pytest.mark.parametrize("only", [False, True], ids=["clear-all", "clear-only"])
@pytest.mark.parametrize("folder", sorted(BESIDE))
def test_a_user_file_beside_linnets_own_is_kept(tmp_path, capsys, clean, folder, only):
    made = linnet_writes(clean, tmp_path)
    mine = {rel: f"user bytes of {rel}".encode() for rel in BESIDE[folder]}
    if folder == "demo":
        mine = {rel: safetensors_bytes(7.0) for rel in BESIDE[folder]}
    user_tree(clean, mine)
    rc, text = clear(capsys, *(["--only", folder] if only else []))
    assert rc == 0 and "kept in" in text
    for rel, data in mine.items():
        assert (clean / rel).read_bytes() == data, rel
    ours = made if not only else [m for m in made if folder_of(m) == folder]
    assert_cleared(clean, ours)


def folder_of(rel: str) -> str:
    if rel.startswith("benchmarks.json"):
        return "timings"
    if rel.startswith("cache/"):
        return rel.split("/")[1]
    return rel.split("/")[0]


# ---------------------------------------------------------------- an earlier version's home
def test_an_earlier_versions_home_is_adopted_and_only_its_files_removed(
    tmp_path, monkeypatch, capsys
):
    import hashlib

    home = tmp_path / "old"
    text = "z = 3\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    old = {
        f"generated/linnet_m_decode_{digest}.py": text.encode(),
        "demo/llama-0123456789ab.safetensors": safetensors_bytes(),
        "demo/llama-0123456789ab.tmp": b"half",
        "benchmarks.json": json.dumps(
            {"format": "linnet.benchmarks", "version": 1, "entries": {}}
        ).encode(),
        "cache/unreadable/20240101T000000-c5au5a2mphshn5mjfphssnhp6upkood6f3jju-abcd1234": b"bad",
        INDUCTOR[0]: b"so",
    }
    mine = {
        "generated/mine.py": b"mine",
        "demo/mine.safetensors": safetensors_bytes(3.0),
        "benchmarks.json.corrupt-20240101T000000-abcd1234": b"maybe mine",
        "cache/inductor/notes.txt": b"notes",
    }
    user_tree(home, {**old, **mine})
    monkeypatch.setenv("LINNET_HOME", str(home))
    assert main(["cache"]) == 0
    assert "earlier Linnet" in capsys.readouterr().out
    rc, text_out = clear(capsys)
    assert rc == 0 and "marked" in text_out
    assert (home / "CACHEDIR.TAG").is_file()
    assert_cleared(home, list(old))
    for rel, data in mine.items():
        assert (home / rel).read_bytes() == data


# ---------------------------------------------------------------- Linnet's writers
def test_the_timing_cache_leaves_a_users_benchmarks_json_alone(tmp_path, monkeypatch):
    import warnings

    from linnet.plan import CacheWarning, TimingCache

    home = user_tree(
        tmp_path / "me", {"benchmarks.json": b"my own benchmark numbers", "thesis.tex": b"x"}
    )
    monkeypatch.setenv("LINNET_HOME", str(home))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = TimingCache()
        cache.put("k", 1.0)
        cache.flush()
    said = " ".join(str(w.message) for w in caught if issubclass(w.category, CacheWarning))
    assert "left it as it is" in said
    assert (home / "benchmarks.json").read_bytes() == b"my own benchmark numbers"
    assert not list(home.glob("benchmarks.json.corrupt-*"))


def test_generated_source_replaces_a_link_never_writes_through_it(tmp_path, clean):
    import hashlib

    from linnet.lang.home import import_source, linnet_home

    text = "w = 4\n"
    name = f"linnet_through_{hashlib.sha256(text.encode()).hexdigest()[:20]}.py"
    theirs = tmp_path / "theirs.py"
    theirs.write_text("precious")
    (linnet_home() / "generated").mkdir(parents=True)
    (clean / "generated" / name).symlink_to(theirs)
    assert import_source(text, "linnet_through").w == 4
    assert theirs.read_text() == "precious"
    assert (clean / "generated" / name).read_text() == text


def test_a_demo_checkpoint_replaces_a_link_never_writes_through_it(tmp_path, clean):
    from linnet.lang.host.run import demo_checkpoint

    model = tmp_path / "m.linnet"
    model.write_text("model")
    first = demo_checkpoint(model, {}, 1, lambda p: p.write_bytes(b"linnet's"))
    first.unlink()
    theirs = tmp_path / "theirs.safetensors"
    theirs.write_bytes(b"precious")
    first.symlink_to(theirs)
    again = demo_checkpoint(model, {}, 1, lambda p: p.write_bytes(b"linnet's"))
    assert again == first and not again.is_symlink() and again.read_bytes() == b"linnet's"
    assert theirs.read_bytes() == b"precious"


# ---------------------------------------------------------------- random homes
SEEDS = range(8) if os.environ.get("CI") else range(40)
NAMES = [
    "notes.txt",
    "model.py",
    "w.safetensors",
    "README",
    "c5au5a2mphs.so",
    "x.json",
    "linnet_m_0123456789abcdef0123.py",
    "llama-0123456789ab.safetensors",
    "benchmarks.json.corrupt-x",
    "a.tmp",
    "data.bin",
    "lock",
    "__grp__mine.json",
    "backup-c5au5a2mphshn5mjfphssnhp6upkood6f3jju32shuhiunzavhf6.tar",
    "x.autotune.json",
    "cuda_utils.so",
    "triton_poi_fused_sin_0.ptx",
]
PLACES = [
    "",
    "generated",
    "demo",
    "cache",
    "cache/inductor",
    "cache/inductor/5a",
    "cache/inductor/fxgraph",
    "cache/triton",
    "cache/unreadable",
    "generated/deep/er",
    "cache/triton/ALW3J5ZQ2MBTVU7DXFPD6NF5YF6U4DWDUBFHXVR6DCKHOG3A4JRA",
]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_user_files_in_a_linnet_home_survive_a_clear(tmp_path, capsys, clean, seed):
    rng = random.Random(seed)
    made = linnet_writes(clean, tmp_path)
    mine: dict[str, bytes] = {}
    for _ in range(rng.randint(1, 12)):
        rel = "/".join(p for p in (rng.choice(PLACES), rng.choice(NAMES)) if p)
        if (
            rel in made
            or rel in ("benchmarks.json",)
            or any(m.startswith(rel + "/") for m in [*made, *mine])
            or any(rel.startswith(m + "/") for m in mine)
        ):
            continue
        mine[rel] = rng.randbytes(rng.randint(1, 64))
    user_tree(clean, mine)
    rc, _ = clear(capsys, *(["--only", rng.choice(CACHE_FOLDERS)] if rng.random() < 0.3 else []))
    assert rc == 0
    for rel, data in mine.items():
        assert (clean / rel).read_bytes() == data, rel


def test_a_fifo_and_a_dangling_link_in_linnets_folders_are_kept(tmp_path, capsys, clean):
    made = linnet_writes(clean, tmp_path)
    fifo = clean / "generated" / "pipe"
    os.mkfifo(fifo)  # opening it would block: it is never read
    dangling = clean / "cache" / "inductor" / "gone"
    dangling.symlink_to(tmp_path / "nowhere")
    rc, text = clear(capsys)
    assert rc == 0 and fifo.exists() and dangling.is_symlink()
    assert "kept, not followed" in text
    assert_cleared(clean, made)


def test_the_cache_names_the_cli_offers_are_the_folders_it_clears(clean):
    assert [e.name for e in torch_home.cache_entries()] == list(torch_home.CACHE_NAMES)
    assert list(torch_home.CACHE_NAMES) == list(CACHE_FOLDERS)
