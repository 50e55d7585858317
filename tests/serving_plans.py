"""Shared by the serving-layout tests (tests/core/test_serving_triton.py, tests/adapters/test_serving_adapters.py):
the ``micro`` geometries (the smallest tiles the Triton kernels take) and two explicit plans over
3 rows (row 1 padding)."""

MICRO = {"gdn": {"family": "gdn", "num_k_heads": 1, "num_v_heads": 2, "head_k_dim": 16, "head_v_dim": 8},
         "kda": {"family": "kda", "num_k_heads": 1, "num_v_heads": 2, "head_k_dim": 16, "head_v_dim": 8},
         "mamba2": {"family": "mamba2", "nheads": 2, "headdim": 8, "dstate": 16, "ngroups": 1}}
# row r's window length per step (row 1 is padding); every row's k within it; steps 0-1 flush-free for
# row 0, a flush for row 2 at step 2 (write_pos 4)
PACKED = {"accepted": [[2, 0, 1], [1, 0, 3], [2, 0, 1]], "window_lens": [[2, 0, 3], [1, 0, 3], [3, 0, 1]],
          "layout": "packed"}
# speculative, standard, speculative, standard: both kinds of step at flush and non-flush cursors
MIXED = {"accepted": [[2, 0, 1], [1, 0, 1], [3, 0, 2], [1, 0, 1]], "standard_steps": [1, 3]}
