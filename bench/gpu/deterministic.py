"""--deterministic for the training scripts: the same seed gives the same
losses in every run, so native and allocd runs can be compared bit for bit
(without it, bf16 backward kernels that accumulate with atomics differ from
run to run, native against native too)."""
import os


def add_argument(parser):
    parser.add_argument("--deterministic", action="store_true",
                        help="PyTorch's deterministic algorithms (and cuBLAS's fixed "
                             "workspace): runs of one seed give bit-identical losses")


def before_torch(args):
    """Call before `import torch`: cuBLAS reads its workspace setting when
    its first handle is made."""
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def after_torch(args, torch):
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
