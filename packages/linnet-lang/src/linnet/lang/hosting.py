"""What a runtime hosting Linnet models on an array library shares, written once.

``linnet.torch`` and ``linnet.jax`` load the same models, check the same entry inputs, run
the same `linnet run` demo and check kernels the same way; only the array library differs.
The parts that do not touch it live here, so that both raise the same coded errors with the
same messages and print the same lines: each runtime passes what it alone knows (a dtype's
name, a host copy of an index input as ints, a function that writes a checkpoint) and keeps
the rest. Named "hosting" because this is the runtimes' side of the compiler: what hosting a
model takes beyond emitting its code.

Sections: loading (E0601, E0713, E0741, E0743, E0744), `linnet run` and generate's options
(E0740, E0786-E0788, E0812-E0815, E0819) and kernel checks; entry inputs (E0720, E0722,
E0780, E0783, E0784) are in :mod:`linnet.lang.host.inputs`, imported here too, and the rest
of ``Model.generate`` (E0794, E0810-E0819) in :mod:`linnet.lang.host.generate`. Nothing here
imports torch, jax or NumPy (linnet-lang is pure Python).

>>> error("E0713", "numerics must be 'exact' or 'fast', not 'quick'").diagnostics[0].code
'E0713'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# The runtimes' kernel checks draw scalar parameters with scalar_value.
from linnet.lang.check.kernel_cases import scalar_value  # noqa: F401

# Entry inputs live in linnet.lang.host.inputs; the runtimes import them from here too.
from linnet.lang.host.inputs import (  # noqa: F401
    GATHER_EXAMPLE,
    bind_inputs,
    check_count,
    dtype_error,
    error,
    in_range,
    range_error,
    range_error_of,
    range_parts,
    short,
)
from linnet.lang.host.run import RunSetup, default_model, run_setup  # noqa: F401

# NUMERICS (the values of linnet.lang.pipeline.Numerics) is what the runtimes re-export.
from linnet.lang.pipeline import NUMERICS, Numerics  # noqa: F401
from linnet.lang.weights.demo import parameter_types  # noqa: F401  (the runtimes' random_weights)

if TYPE_CHECKING:

    pass

# Moved whole, by idea, into linnet.lang.host (issue 39); the next commit updates the importers
# and removes this module.
from linnet.lang.host.loading import (  # noqa: F401
    FLOATS,
    check_dtype_config,
    check_finite_flag,
    check_numerics,
    check_weights_type,
    entry_method,
    load_program,
    nonfinite_weight,
    programs_kept,
    read_config,
    read_headers,
)
from linnet.lang.host.options import (  # noqa: F401
    DEFAULT_TIMEOUT,
    RANKS_PER_CORE,
    SEED_RANGE,
    TIMEOUT_ENV,
    check_length,
    check_nproc,
    check_run_options,
    check_sampling,
    check_seed,
    rank_timeout,
    run_tokens,
    stop_token_error,
    usable_cores,
)
from linnet.lang.host.printing import (  # noqa: F401
    announce_demo,
    loaded_line,
    prefill_line,
    summary_lines,
    token_line,
)
from linnet.lang.host.run import demo_checkpoint  # noqa: F401
from linnet.lang.host.verdicts import (  # noqa: F401
    SHORT_FLOATS,
    Found,
    KernelFault,
    case_graph,
    check_launch,
    exact_case,
    nan_found,
    no_further_than_the_body,
    shape_found,
)

run_config = run_setup
