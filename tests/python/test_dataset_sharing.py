"""How a dataset reaches ll.DataLoader's workers, against torch's DataLoader
(fork and spawn) on the same dataset objects: what each pass sees after the
main process writes the dataset, writes of other threads, ndarray
subclasses, share_in_place over reallocated tensors, fresh views every
pass, and the shared memory itself (no name to leave behind, no /dev/shm
size to hit).

Datasets are module-level classes so that spawned workers can import them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import Dataset  # noqa: E402

import leanloader as ll  # noqa: E402
from leanloader.memory import process_tree_memory  # noqa: E402

MIB = 1 << 20
TORCH_METHODS = ("fork", "spawn")


def _torch_loader(dataset, method: str, **options):
    return torch.utils.data.DataLoader(
        dataset, batch_size=4, num_workers=1, multiprocessing_context=method, **options
    )


def _ll_loader(dataset, **options):
    return ll.DataLoader(dataset, batch_size=4, num_workers=1, **options)


def _pass(loader) -> list[list[float]]:
    return [batch.tolist() for batch in loader]


# --- writes of the main process between passes --------------------------------------------


class Labels(Dataset):
    """Pseudo-labels in a 4 MiB array and a 4 MiB tensor, rewritten in place
    between epochs (curriculum weights, self-training)."""

    def __init__(self) -> None:
        self.labels = np.zeros(MIB, dtype=np.float32)
        self.weights = torch.zeros(MIB, dtype=torch.float32)

    def relabel(self, value: float) -> None:
        self.labels[:] = value
        self.weights[:] = 10 * value

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        return torch.tensor([float(self.labels[i * 1000]), float(self.weights[i * 1000])])


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_a_pass_sees_the_main_process_writes_as_torch_workers_do(persistent):
    seen = {}
    # (spawn gives fresh workers what fork gives them; its persistent
    # workers differ, so it runs there)
    for name in ("ll", *(TORCH_METHODS if persistent else ("fork",))):
        dataset = Labels()
        if name == "ll":
            loader = _ll_loader(dataset, persistent_workers=persistent)
        else:
            loader = _torch_loader(dataset, name, persistent_workers=persistent)
        passes = []
        for epoch in range(3):
            dataset.relabel(epoch + 1.0)
            passes.append(_pass(loader))
        if name == "ll":
            loader.close()
        seen[name] = passes
    assert seen["ll"] == seen["fork"]
    if persistent:
        # torch's spawn moves the dataset's tensors into shared memory when
        # it pickles them, so its persistent workers see later writes to
        # tensors (not to arrays); leanloader leaves the dataset as it was
        # (the README names this)
        assert [[row[0] for row in b[0]] for b in seen["spawn"]] == [[1.0] * 4] * 3
    first = seen["ll"][0][0][0]
    assert first == [1.0, 10.0]
    # fresh workers see every update; persistent ones keep the first pass's
    last = seen["ll"][2][0][0]
    assert last == ([1.0, 10.0] if persistent else [3.0, 30.0])


def test_an_unchanged_dataset_is_not_copied_again():
    dataset = Labels()
    loader = _ll_loader(dataset)
    _pass(loader)
    segments = {id(s) for s in loader.dataset_sharing().segments}
    _pass(loader)
    assert {id(s) for s in loader.dataset_sharing().segments} == segments
    dataset.relabel(5.0)
    assert _pass(loader)[0][0] == [5.0, 50.0]
    # the superseded copies left: one current copy per array and tensor
    assert len(loader.dataset_sharing().segments) == 2


# --- writes of other threads --------------------------------------------------------------


class Counters(Dataset):
    def __init__(self) -> None:
        # 96 MiB each: above what glibc's heap keeps free (its trim threshold
        # is at most 64 MiB), so each is always a block malloc mapped on its own
        # and its pages are shared (a 32 MiB array came from a fragmented heap
        # late in the suite, and got a plain copy).
        self.counts = np.zeros(12 * MIB, dtype=np.int64)
        self.tensor = torch.zeros(12 * MIB, dtype=torch.int64)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.tensor([int(self.counts[i]), int(self.tensor[i])])


def test_no_write_of_another_thread_is_lost_while_loaders_share_the_dataset():
    # A thread adds 1 to every element, again and again (NumPy and torch
    # release the GIL inside the loop), while loaders start and share the
    # arrays, their pages included: every increment must land.
    dataset = Counters()
    stop = threading.Event()
    rounds = [0]

    backwards = dataset.counts[::-1]  # against the copy's direction: they cross

    def writer() -> None:
        while not stop.is_set():
            np.add(backwards, 1, out=backwards)
            dataset.tensor.add_(1)
            rounds[0] += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        loader = _ll_loader(dataset, persistent_workers=False)
        for _ in range(10):
            loader.setup_bytes()  # what each pass's iter() sends its workers
        assert len(next(iter(loader))) == 4
        # the pages were shared while the thread wrote (no second copy)
        assert loader.dataset_sharing().shared_page_bytes >= 2 * (96 * MIB - 4096)
    finally:
        stop.set()
        thread.join()
    assert rounds[0] > 0
    assert int(dataset.counts.min()) == int(dataset.counts.max()) == rounds[0]
    assert int(dataset.tensor.min()) == int(dataset.tensor.max()) == rounds[0]


# --- types --------------------------------------------------------------------------------


class Subclasses(Dataset):
    def __init__(self) -> None:
        data = np.arange(512 * 1024, dtype=np.float64).reshape(512, 1024)  # 4 MiB
        self.masked = np.ma.masked_array(data, mask=data % 3 == 0)
        self.matrix = np.matrix(np.eye(512) * 2.0)  # 2 MiB

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        row = self.masked[i]
        product = self.matrix * self.matrix  # matrix product for np.matrix
        return torch.tensor(
            [float(row.mean()), float(row.count()), float(product[i, i]),
             float(isinstance(self.masked, np.ma.MaskedArray)),
             float(isinstance(self.matrix, np.matrix))]
        )  # fmt: skip


def test_ndarray_subclasses_keep_their_type_as_with_torch():
    dataset = Subclasses()
    loader = _ll_loader(dataset)
    ours = _pass(loader)
    for method in TORCH_METHODS:
        assert ours == _pass(_torch_loader(dataset, method))
    assert ours[0][0][2] == 4.0 and ours[0][0][3] == ours[0][0][4] == 1.0


class Layouts(Dataset):
    """Arrays whose layout and flags a worker's code may rely on: a
    Fortran-ordered matrix (a BLAS result, a MATLAB file's array), a
    read-only buffer (np.frombuffer of a file's bytes), and a tensor the
    program put in shared memory to collect what workers write."""

    def __init__(self) -> None:
        self.fortran = np.asfortranarray(np.arange(MIB, dtype=np.float32).reshape(1024, 1024))
        self.frozen = np.frombuffer(bytes(4 * MIB), dtype=np.float32)
        self.small_frozen = np.frombuffer(bytes(256), dtype=np.float32)
        self.collected = torch.zeros(16).share_memory_()  # 64 bytes

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        self.collected[i] = i + 1
        writes = []
        for array in (self.frozen, self.small_frozen):
            try:
                array[0] = 1.0
                writes.append(1.0)
            except ValueError:
                writes.append(0.0)
        return torch.tensor(
            [*self.fortran.strides, *self.fortran.ravel(order="K")[:2].tolist(),
             float(self.fortran.flags.f_contiguous), *writes]
        )  # fmt: skip


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_array_layout_read_only_flags_and_shared_tensors_as_with_torch_fork(strategy):
    import torch.multiprocessing

    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(strategy)
    try:
        seen = {}
        for name in ("ll", "ll-in-place", "fork"):
            dataset = Layouts()
            if name == "fork":
                loader = _torch_loader(dataset, name)
            else:
                loader = _ll_loader(dataset, share_in_place=name == "ll-in-place")
            seen[name] = (_pass(loader), dataset.collected[:4].tolist())
            # (moved in place, the program's own array keeps its order)
            assert dataset.fortran.flags.f_contiguous
    finally:
        torch.multiprocessing.set_sharing_strategy(before)
    assert seen["ll"] == seen["ll-in-place"] == seen["fork"]
    rows, collected = seen["ll"]
    # Fortran order kept, both read-only arrays refused the write, and the
    # worker's writes reached the program's shared tensor
    assert rows[0][0] == [4.0, 4096.0, 0.0, 1024.0, 1.0, 0.0, 0.0]
    assert collected == [1.0, 2.0, 3.0, 4.0]


class SharedByTheProgram(Dataset):
    """Arrays over memory the program shares on purpose so that workers can
    write results into it: a small SharedMemory block, RawArray, and a
    synchronized Array, at sizes below and above the share threshold."""

    def __init__(self, blocks: list) -> None:
        import multiprocessing
        from multiprocessing import shared_memory

        small = shared_memory.SharedMemory(create=True, size=512 * 1024)
        blocks.append(small)
        self.arrays = [
            np.ndarray((128 * 1024,), np.float32, buffer=small.buf),
            np.frombuffer(multiprocessing.RawArray("f", MIB), np.float32),
            np.frombuffer(multiprocessing.RawArray("d", 64), np.float64)[8:32:2],
            np.frombuffer(multiprocessing.Array("i", 1000).get_obj(), np.int32),
        ]

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        for array in self.arrays:
            array[i] = i + 1
        return i


def test_workers_write_into_memory_the_program_shares_as_with_torch_fork():
    blocks: list = []
    try:
        seen = {}
        for name in ("ll", "fork"):
            dataset = SharedByTheProgram(blocks)
            loader = _ll_loader(dataset) if name == "ll" else _torch_loader(dataset, name)
            _pass(loader)
            seen[name] = [array[:4].tolist() for array in dataset.arrays]
        assert seen["ll"] == seen["fork"] == [[1, 2, 3, 4]] * 4
    finally:
        for block in blocks:
            block.close()
            block.unlink()


# --- share_in_place over reallocated tensors ----------------------------------------------


class Replaced(Dataset):
    def __init__(self) -> None:
        self.table = torch.zeros(MIB, dtype=torch.float32)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return self.table[i : i + 2].clone()


def test_share_in_place_never_hands_a_new_tensor_an_old_one_s_values():
    dataset = Replaced()
    loader = _ll_loader(dataset, share_in_place=True)
    for epoch in range(4):
        # a new tensor each epoch: it may land at a freed tensor's address
        dataset.table = torch.full((MIB,), float(epoch))
        assert float(dataset.table[5]) == float(epoch)
        assert all(v == [float(epoch)] * 2 for batch in _pass(loader) for v in batch)
        assert float(dataset.table[5]) == float(epoch)  # the main process's values too
    loader.close()


# --- fresh views each pass ----------------------------------------------------------------


class FreshViews(Dataset):
    """`__getstate__` returns new views of the same 16 MiB every time."""

    def __init__(self) -> None:
        self.base = np.ones((4 * MIB,), dtype=np.float32)

    def __getstate__(self):
        return {"base": self.base.reshape(-1, 1024)[:, :]}

    def __setstate__(self, state) -> None:
        self.base = state["base"]

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.tensor([float(self.base.reshape(-1)[i])])


def test_fresh_views_every_pass_do_not_grow_shared_memory():
    dataset = FreshViews()
    loader = _ll_loader(dataset)
    held = []
    for _ in range(4):
        _pass(loader)
        memory = process_tree_memory()
        held.append(memory["fd_shmem_bytes"] + memory["pss_shmem_bytes"])
    assert len(loader.dataset_sharing().segments) == 1
    assert held[-1] <= held[1] + 4 * MIB, held


class Replenished(Dataset):
    """Between passes, a tensor gets a new storage (`t.data = ...`) and the
    array shows a longer prefix of a preallocated buffer (a replay buffer
    filling up)."""

    def __init__(self) -> None:
        self.buffer = np.zeros(32 * MIB, dtype=np.uint8)
        self.filled = self.buffer[:MIB]
        self.weights = torch.zeros(MIB)

    def next_pass(self, n: int) -> None:
        self.weights.data = torch.full((MIB,), float(n))
        self.filled = self.buffer[: (n + 1) * MIB]

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return torch.tensor([float(self.weights[i]), float(len(self.filled))])


def test_copies_no_pass_refers_to_are_dropped_as_the_dataset_changes():
    dataset = Replenished()
    loader = _ll_loader(dataset)
    for n in range(8):
        dataset.next_pass(n)
        assert _pass(loader)[0][0] == [float(n), float((n + 1) * MIB)]
    # one copy for the tensor's current storage, one for the current prefix,
    # one for the whole buffer (each superseded one left: 8 passes had kept 17)
    sharing = loader.dataset_sharing()
    assert len(sharing.copies) == 3
    assert sum(c.nbytes for c in sharing.copies.values()) == 4 * MIB + 8 * MIB + 32 * MIB


# --- the shared memory itself -------------------------------------------------------------

CREATE_FOREVER = textwrap.dedent(
    """
    import sys
    from leanloader import _core
    print("ready", flush=True)
    while True:
        _core.SharedSegment.create(1 << 20, sys.argv[1])
    """
)


def test_a_sigkill_while_creating_segments_leaves_nothing(tmp_path):
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    directory = Path("/dev/shm") / f"leanloader-test-{os.getpid()}"
    directory.mkdir()
    try:
        for attempt in range(20):
            child = subprocess.Popen(
                [sys.executable, "-c", CREATE_FOREVER, str(directory)], stdout=subprocess.PIPE
            )
            assert child.stdout.readline().strip() == b"ready"
            time.sleep(0.01 * (attempt % 5))
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()
            assert os.listdir(directory) == []
    finally:
        for leftover in directory.iterdir():
            leftover.unlink()
        directory.rmdir()


SMALL_SHM = textwrap.dedent(
    """
    import subprocess, sys
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", "/dev/shm"], check=True)
    sys.path.insert(0, {tests!r})
    import numpy as np, torch
    import leanloader as ll
    from test_dataset_sharing import ManyArrays

    if __name__ == "__main__":
        dataset = ManyArrays(count=50, elements=1 << 20)  # 50 x 4 MiB = 200 MiB
        ours = [b.tolist() for b in ll.DataLoader(dataset, batch_size=5, num_workers=2)]
        theirs = [b.tolist() for b in torch.utils.data.DataLoader(
            dataset, batch_size=5, num_workers=2, multiprocessing_context="fork")]
        assert ours == theirs, (ours[:2], theirs[:2])
        print("same", len(ours))
    """
)


class ManyArrays(Dataset):
    def __init__(self, count: int, elements: int) -> None:
        self.arrays = [np.full(elements, i, dtype=np.float32) for i in range(count)]

    def __len__(self) -> int:
        return len(self.arrays)

    def __getitem__(self, i: int):
        return torch.tensor([float(self.arrays[i][-1]), float(self.arrays[i].size)])


def test_arrays_larger_than_a_small_dev_shm_reach_the_workers():
    # Docker's and Kubernetes' default /dev/shm is 64 MiB: a private mount
    # namespace with one that size.
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a mount namespace here (needs root / CAP_SYS_ADMIN)")
    script = SMALL_SHM.format(tests=str(Path(__file__).parent))
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "same 10" in result.stdout


MANY_UNDER_FD_LIMIT = textwrap.dedent(
    """
    import os, resource, sys
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    sys.path.insert(0, {tests!r})
    import torch
    import leanloader as ll
    from leanloader import _core
    from test_dataset_sharing import ManyArrays

    if __name__ == "__main__":
        # 1,500 pre-decoded images of 1.1 MiB, each an array of its own
        dataset = ManyArrays(count=1500, elements=288 * 1024)
        loader = ll.DataLoader(dataset, batch_size=100, num_workers=2)
        ours = [b.tolist() for b in loader]
        descriptors = len(os.listdir("/proc/self/fd"))
        theirs = [b.tolist() for b in torch.utils.data.DataLoader(
            dataset, batch_size=100, num_workers=2, multiprocessing_context="fork")]
        assert ours == theirs, (ours[0][:2], theirs[0][:2])
        print("same", len(ours), "descriptors", descriptors,
              "segments", len(loader.dataset_sharing().segments))
    """
)


def test_1500_arrays_reach_the_workers_under_the_usual_descriptor_limit():
    # One arena file for all shared copies: one descriptor in the main
    # process and one in each worker, not one per array.
    script = MANY_UNDER_FD_LIMIT.format(tests=str(Path(__file__).parent))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    words = result.stdout.split()
    assert words[:2] == ["same", "15"], result.stdout
    assert int(words[3]) < 100, result.stdout  # descriptors open after the pass
    assert words[5] == "1500", result.stdout


# --- what is a file stays a file ----------------------------------------------------------


class FileViews(Dataset):
    """A train split of a token file (a memmap slice, reshaped), a tensor of
    torch.load(mmap=True) and one of ll.load_safetensors: 48 MiB of files."""

    def __init__(self, directory: Path) -> None:
        tokens = directory / "tokens.bin"
        np.arange(8 * MIB, dtype=np.int32).tofile(tokens)  # 32 MiB
        self.split = np.memmap(tokens, dtype=np.int32, mode="r")[2 * MIB : 6 * MIB].reshape(
            -1, 1024
        )
        torch.save({"w": torch.arange(2 * MIB, dtype=torch.float32)}, directory / "w.pt")
        self.weights = torch.load(directory / "w.pt", mmap=True)["w"]  # 8 MiB
        ll.save_safetensors(directory / "e.st", {"e": np.full((MIB,), 3, dtype=np.float64)})
        self.embeddings = ll.load_safetensors(directory / "e.st", output="torch")["e"]

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.tensor(
            [float(self.split[i * 100, 7]), float(self.weights[i * 1000]),
             float(self.embeddings[i]), float(isinstance(self.split, np.memmap))]
        )  # fmt: skip


def test_memmap_views_and_mapped_tensors_reach_workers_as_their_files(tmp_path):
    dataset = FileViews(tmp_path)
    before = process_tree_memory()
    loader = _ll_loader(dataset, persistent_workers=True)
    ours = _pass(loader)
    held = process_tree_memory()
    # Nothing was copied into shared memory: each worker mapped the files.
    assert loader.dataset_sharing().segments == []
    assert len(loader.setup_bytes()) < 16 * 1024
    shmem = (held["fd_shmem_bytes"] + held["pss_shmem_bytes"]) - (
        before["fd_shmem_bytes"] + before["pss_shmem_bytes"]
    )
    assert shmem < 4 * MIB, shmem  # (batches only; the files are 48 MiB)
    loader.close()
    assert ours == _pass(_torch_loader(dataset, "fork"))
    assert ours[0][0] == [2 * MIB + 7.0, 0.0, 3.0, 1.0]
    # ll.audit says what sharing does: nothing to send for any of them.
    report = ll.audit(dataset, threshold=1)
    entries = {entry.path.rsplit(".", 1)[-1]: entry for entry in report.entries}
    assert "split" not in entries
    assert "mapped again from its file" in entries["weights"].fix
    assert "mapped again from its file" in entries["embeddings"].fix


def test_a_memmap_written_in_private_is_copied_with_its_writes(tmp_path):
    path = tmp_path / "private.bin"
    np.zeros(MIB, dtype=np.float32).tofile(path)
    dataset = Labels()
    dataset.labels = np.memmap(path, dtype=np.float32, mode="c")  # copy-on-write
    dataset.labels[:] = 9.0  # private pages: the file still holds zeros
    assert ll.audit(dataset, threshold=1).entries[0].path.endswith("labels")
    rows = _pass(_ll_loader(dataset))
    assert rows[0][0] == [9.0, 0.0]


class NumpyBackedCache(Dataset):
    """A RAM image cache as YOLO keeps one: a non-resizable uint8 tensor over a
    NumPy array's 48 MiB block (torch.from_numpy)."""

    def __init__(self) -> None:
        self.cache = torch.from_numpy(np.full((48, MIB), 5, dtype=np.uint8))

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return self.cache[i, :4].clone()


NON_RESIZABLE = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import leanloader as ll
    from leanloader import _core
    from test_dataset_sharing import MIB, NumpyBackedCache

    if __name__ == "__main__":
        dataset = NumpyBackedCache()
        assert not dataset.cache.untyped_storage().resizable()
        print("refusal:", _core.page_sharing_refusal(dataset.cache.data_ptr(), 48 * MIB))
        loader = ll.DataLoader(dataset, batch_size=4, num_workers=1)
        assert all(v == 5 for batch in loader for row in batch.tolist() for v in row)
        assert int(dataset.cache.sum()) == 5 * 48 * MIB
        print("shared_page_bytes:", loader.dataset_sharing().shared_page_bytes)
    """
)


def _fresh_interpreter(script: str) -> tuple[dict[str, str], str]:
    """Runs `script` (formatted with this directory as `tests`) in a fresh
    interpreter: after earlier tests free large blocks, glibc may serve
    48 MiB from the top of its heap instead of mapping a block of its own (a
    heap block is copied, not shared: shared_copy.h). Returns its "key:
    value" lines and its whole output."""
    script = script.format(tests=str(Path(__file__).parent))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    if "allocator" in lines.get("refusal", ""):
        pytest.skip("this process's malloc is not glibc's: copies stay plain copies")
    return lines, result.stdout


def test_a_non_resizable_tensor_over_a_malloc_block_shares_its_pages():
    lines, output = _fresh_interpreter(NON_RESIZABLE)
    assert lines["refusal"] == "", output
    # one copy in all: the tensor's pages are the copy's
    assert int(lines["shared_page_bytes"]) >= 48 * MIB - 2 * 4096, output


class TwoCaches(Dataset):
    """A YOLO-style RAM cache (one uint8 tensor from torch's allocator) and a
    NumPy array, 48 MiB each: blocks glibc's malloc maps on their own."""

    def __init__(self) -> None:
        self.tensor = torch.full((48 * MIB,), 5, dtype=torch.uint8)
        self.array = np.full(48 * MIB, 7, dtype=np.uint8)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return torch.tensor([int(self.tensor[i * MIB]), int(self.array[i * MIB])])


SHARED_AHEAD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    import leanloader as ll
    from leanloader import _core
    from test_dataset_sharing import MIB, TwoCaches

    if __name__ == "__main__":
        dataset = TwoCaches()
        print("refusal:", _core.page_sharing_refusal(dataset.tensor.data_ptr(), 48 * MIB))
        loader = ll.DataLoader(dataset, batch_size=4, num_workers=1)
        sharing = loader.dataset_sharing()  # (waits for the copies made meanwhile)
        ahead = {{id(s) for s in sharing.segments}}
        print("copied ahead:", len(ahead), sharing.shared_page_bytes)
        first = [b.tolist() for b in loader]
        print("reused:", {{id(s) for s in sharing.segments}} == ahead)
        dataset.tensor[: 2 * MIB] = 9  # written after its copy was made
        dataset.array[MIB : 2 * MIB] = 3
        second = [b.tolist() for b in loader]
        print("passes:", first, second)
    """
)


def test_copies_made_before_the_first_pass_serve_it_and_later_writes_are_seen():
    # The loader copies large arrays and tensors whose pages it can share on
    # a thread from its construction; a pass uses such a copy only while its
    # source still holds its bytes.
    lines, output = _fresh_interpreter(SHARED_AHEAD)
    assert lines["refusal"] == "", output
    count, shared = (int(v) for v in lines["copied ahead"].split())
    assert count == 2 and shared >= 2 * (48 * MIB - 2 * 4096), output
    assert lines["reused"] == "True", output
    # what torch's workers give for the same writes
    first = [[[5, 7]] * 4] * 2
    second = [[[9, 7], [9, 3], [5, 7], [5, 7]], [[5, 7]] * 4]
    assert lines["passes"] == f"{first} {second}", output
