"""Fail when a shared library carries its own copy of libstdc++ instead of linking it.

torchcond._C must use the libstdc++ that torch and Python already loaded. A library
linked with its own copy (``-static-libstdc++``, or a toolchain that offers only
``libstdc++.a``) defines libstdc++'s stream, locale and exception code itself: its
iostreams then meet locale facets set up by the other copy, and an error message
that formats a number through ``std::ostream`` is cut off or crashes the process.

This reads the ELF dynamic symbol table and the DT_NEEDED entries with Python
alone (no binutils), so the check runs on a bare machine. setup.py runs it after
linking, the tests run it on the built ``_C``.

Usage: ``python tools/check_libstdcxx.py LIBRARY...``. Prints the libstdc++ symbols
each library defines and exits with 1 if any does, or if it does not link
libstdc++.so.6.
"""

from __future__ import annotations

import re
import struct
import sys

SHT_DYNSYM = 11
SHT_DYNAMIC = 6
SHN_UNDEF = 0
DT_NEEDED = 1

# Symbols that only libstdc++'s own compiled objects define: functions declared in
# its headers but defined in its .cc files, and explicit instantiations its headers
# declare `extern template`. A library's own code never emits them, not even as weak
# copies of inline or template code (std::string and std::vector members, which _C
# does define), so a match means libstdc++ itself was linked in. Each is in
# libstdc++.so.6 since GLIBCXX_3.4.9 / CXXABI_1.3 (gcc 4.2), so none is ever in the
# libstdc++_nonshared.a that RHEL's gcc-toolset (manylinux, torch's own wheels) links
# into every library: that archive holds only what the system's libstdc++ lacks, such
# as std::__throw_bad_array_new_length, which torch's libc10.so defines.
RUNTIME_SYMBOL = re.compile(
    r"^(?:"
    # the C++ ABI runtime: throwing, catching, static-local guards (libsupc++)
    r"__cxa_(?:throw|rethrow|begin_catch|end_catch|allocate_exception|free_exception"
    r"|guard_acquire|guard_release|guard_abort|get_globals)"
    r"|__gxx_personality_v0"  # the exception personality routine
    r"|_ZSt9terminatev"  # std::terminate()
    r"|_ZNSo9_M_insertI(?:[lmxydbe]|PKv)EERSoT_"  # std::ostream::_M_insert<long, ...>
    r"|_ZNSi10_M_extractI(?:[tjlmxyfdbe]|Pv)EERSiRT_"  # std::istream::_M_extract<...>
    r"|_ZNSt6locale(?:C[12]Ev|D[12]Ev|7classicEv|5_ImplC[12]Em|2id11_S_refcountE)"
    r"|_ZNSt8ios_base4InitC[12]Ev"  # the std::cout/std::cerr set-up
    r"|_ZTVN10__cxxabiv1(?:17__class|20__si_class|21__vmi_class)_type_infoE"
    r")$"
)


class NotElf(ValueError):
    pass


def _elf(path: str):
    """The file's bytes, (type, offset, size, link, entsize) of each section, and its layout."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:4] != b"\x7fELF":
        raise NotElf(f"{path} is not an ELF file (this check reads Linux shared libraries)")
    is64 = data[4] == 2
    end = "<" if data[5] == 1 else ">"
    if is64:
        (shoff,) = struct.unpack_from(end + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
        fmt = end + "IIQQQQIIQQ"
    else:
        (shoff,) = struct.unpack_from(end + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(end + "HH", data, 0x2E)
        fmt = end + "IIIIIIIIII"
    sections = []
    for i in range(shnum):
        _, kind, _, _, offset, size, link, _, _, entsize = struct.unpack_from(
            fmt, data, shoff + i * shentsize
        )
        sections.append((kind, offset, size, link, entsize))
    return data, sections, is64, end


def _string(data: bytes, table, index: int) -> str:
    start = table[1] + index
    return data[start : data.index(b"\0", start)].decode("utf-8", "replace")


def dynamic_symbols(path: str) -> list[tuple[str, bool]]:
    """(name, defined) for every symbol in the library's dynamic symbol table."""
    data, sections, is64, end = _elf(path)
    fmt = end + ("IBBHQQ" if is64 else "IIIBBH")
    symbols = []
    for kind, offset, size, link, entsize in sections:
        if kind != SHT_DYNSYM:
            continue
        for i in range(1, size // entsize):  # entry 0 is the null symbol
            fields = struct.unpack_from(fmt, data, offset + i * entsize)
            name, shndx = fields[0], fields[3] if is64 else fields[5]
            symbols.append((_string(data, sections[link], name), shndx != SHN_UNDEF))
    return symbols


def needed(path: str) -> list[str]:
    """The DT_NEEDED entries: the shared libraries the dynamic loader loads with it."""
    data, sections, is64, end = _elf(path)
    fmt = end + ("qQ" if is64 else "iI")
    names = []
    for kind, offset, size, link, entsize in sections:
        if kind != SHT_DYNAMIC:
            continue
        for i in range(size // entsize):
            tag, value = struct.unpack_from(fmt, data, offset + i * entsize)
            if tag == DT_NEEDED:
                names.append(_string(data, sections[link], value))
    return names


def runtime_definitions(path: str) -> list[str]:
    """The libstdc++ runtime symbols the library defines itself (none when sound)."""
    return sorted(n for n, defined in dynamic_symbols(path) if defined and RUNTIME_SYMBOL.match(n))


def links_shared_libstdcxx(path: str) -> bool:
    return any(n.startswith("libstdc++.so") for n in needed(path))


def problem(path: str) -> str | None:
    """Why the library does not use the shared libstdc++, in one clause; None if it does."""
    own = runtime_definitions(path)
    if own:
        # The stream code that cut the messages short, and the ABI runtime, first.
        own.sort(key=lambda n: (not n.startswith("_ZNSo9_M_insertIm"), n != "__cxa_throw", n))
        return f"it defines {len(own)} of libstdc++'s own symbols, such as {own[0]} and {own[1]}"
    if not links_shared_libstdcxx(path):
        return f"it does not link libstdc++.so.6 (it needs: {', '.join(needed(path)) or 'nothing'})"
    return None


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tools/check_libstdcxx.py LIBRARY...", file=sys.stderr)
        return 2
    bad = 0
    for path in argv:
        try:
            why = problem(path)
        except (OSError, NotElf) as e:
            print(e)
            return 2
        print(f"{path}: {why or 'links the shared libstdc++ and defines none of its symbols'}")
        bad += why is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
