"""C++ names demangled by the C++ runtime's own demangler (probes/demangle.py), and every name
that does not demangle (C names, garbage, no runtime) kept as it is."""

from __future__ import annotations

from gpujitter.probes.demangle import demangle

ADD_KERNEL = "_ZN2at6native10add_kernelERNS_18TensorIteratorBaseERKN3c106ScalarE"


def test_a_mangled_name_reads_as_its_source_spells_it() -> None:
    assert demangle(ADD_KERNEL) == (
        "at::native::add_kernel(at::TensorIteratorBase&, c10::Scalar const&)"
    )
    assert demangle("_ZNSt6vectorIiSaIiEE9push_backERKi") == (
        "std::vector<int, std::allocator<int> >::push_back(int const&)"
    )


def test_what_does_not_demangle_stays_as_it_is() -> None:
    for name in ("memcpy", "_Z", "_Zgarbage", "_ZN2at6nativeE" + "9" * 40, "_ZN\udcff\udcfe",
                 ADD_KERNEL[:30], "", "_Z" + "N1a" * 5000):  # fmt: skip
        assert demangle(name) == name


def test_without_the_cxx_runtime_names_stay_mangled() -> None:
    assert demangle(ADD_KERNEL, runtime="libno-such-runtime.so.6") == ADD_KERNEL
