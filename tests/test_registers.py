"""verify_kernels/registers.py: the programs an SM holds by registers (NVIDIA's per-warp allocation in steps of 256,
the arithmetic the kernels' register caps rest on) and the launch option a cap becomes."""

from verify_kernels.registers import programs_per_sm, register_cap


def test_programs_an_sm_holds_by_registers():
    # the GDN small trees' pass on one warp: 134 registers round up to 136 (4352 a warp), 15 an SM; 128, 16
    assert programs_per_sm(134, 1) == 15
    assert programs_per_sm(128, 1) == 16
    # the Mamba2 split verify's launches on 4 warps: 80 -> 6 and 72 -> 7 (state programs), 64 -> 8 (second launch)
    assert [programs_per_sm(r, 4) for r in (80, 72, 64)] == [6, 7, 8]
    assert programs_per_sm(81, 4) == 5  # 81 x 32 = 2592 rounds up to 2816 a warp: 23 warps, 5 programs of 4
    assert programs_per_sm(255, 2) == 4


def test_a_cap_is_a_launch_option_only_where_set():
    assert register_cap(None) == {}
    assert register_cap(128) == {"maxnreg": 128}
