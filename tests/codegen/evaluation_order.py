#!/usr/bin/env python3
"""evaluation_order.py CLANG LLVM_INCLUDE FILE...: no expression in the code generators
builds IR in two of its operands.

C leaves the order of a call's arguments (and of an operator's operands, and of an
initialiser list's values) open: gcc evaluates them right to left, clang left to right.
An argument that builds an instruction puts it in the block as it is evaluated, so a
call with two such arguments gives IR in an order that depends on the compiler that
built ddpc, and with it the generated code and the keys of ddpc's cache (a clang-built
and a gcc-built ddpc must make the same bytes). cg.h's short names (add, fmul, sel, ...)
are macros that evaluate their operands in order; elsewhere the first built value is
named before the call.

The check reads clang's syntax tree of each FILE (-ast-dump=json). A function builds IR
when it calls an LLVMBuild*, LLVMAppend*, LLVMAdd*, LLVMInsert*, LLVMPosition* or
LLVMSet* function, a function that builds IR, or a function pointer. Each call,
arithmetic or comparison operator and initialiser list whose operands include two that
build IR is reported with its place. A planted case is checked first, so a change in
clang's output cannot make the check pass by finding nothing."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

BUILDS = re.compile(r"^LLVM(Build|Append|Add|Insert|Position|Set)")
UNSEQUENCED_OPERATORS = {"&&", "||", ",", "="}  # these are ordered (or assign)

PLANTED = """
typedef struct LLVMOpaqueValue *LLVMValueRef;
LLVMValueRef LLVMBuildAdd(LLVMValueRef a, LLVMValueRef b);
static LLVMValueRef twice(LLVMValueRef a) { return LLVMBuildAdd(a, a); }
LLVMValueRef planted(LLVMValueRef a, LLVMValueRef b) {
    LLVMValueRef first = twice(a);                  /* ordered: one per declaration */
    LLVMValueRef ok = LLVMBuildAdd(first, twice(b));
    return LLVMBuildAdd(twice(ok), twice(b));       /* line 8: two built operands */
}
"""


def syntax_tree(clang, include, path):
    if not shutil.which(clang):
        sys.exit("FAIL: no clang to read the code generators with (%s): install clang" % clang)
    run = subprocess.run([clang, "-Xclang", "-ast-dump=json", "-fsyntax-only", "-isystem", include,
                          "-I", os.path.dirname(path), path], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("FAIL: clang could not read %s:\n%s" % (path, run.stderr[-2000:]))
    return json.loads(run.stdout)


def callee_name(call):
    """The function a call names, or None for a call through a pointer."""
    stack = [call["inner"][0]]
    while stack:
        node = stack.pop()
        decl = node.get("referencedDecl", {})
        if node.get("kind") == "DeclRefExpr" and decl.get("kind") == "FunctionDecl":
            return decl["name"]
        stack.extend(node.get("inner", []))
    return None


def called(node, names):
    """Every function called under node (None for a pointer), into names."""
    if node.get("kind") == "CallExpr":
        names.add(callee_name(node))
    for child in node.get("inner", []):
        called(child, names)
    return names


def builders(trees):
    """The functions defined in the trees that build IR, directly or through others."""
    calls = {}
    for tree in trees:
        for decl in tree.get("inner", []):
            if decl.get("kind") == "FunctionDecl" and any(c.get("kind") == "CompoundStmt"
                                                          for c in decl.get("inner", [])):
                calls[decl["name"]] = called(decl, set())
    found, grew = set(), True
    while grew:
        grew = False
        for name, names in calls.items():
            if name not in found and any(n is None or n in found or BUILDS.match(n) for n in names):
                found.add(name)
                grew = True
    return found


def line(node, last):
    begin = node.get("range", {}).get("begin", {})
    return begin.get("line") or begin.get("expansionLoc", {}).get("line") or last


def files_of_functions(tree):
    """Each top-level function's file. clang writes a location's file only where it
    changes from the location written before it, in the order of the dump."""
    current, files = [None], {}

    def note(place):
        for where in (place, place.get("spellingLoc", {}), place.get("expansionLoc", {})):
            if "file" in where:
                current[0] = where["file"]

    def follow(node):
        note(node.get("loc", {}))
        rng = node.get("range", {})
        note(rng.get("begin", {}))
        note(rng.get("end", {}))
        for child in node.get("inner", []):
            follow(child)

    for decl in tree.get("inner", []):
        note(decl.get("loc", {}))
        files[id(decl)] = current[0]
        follow(decl)
    return files


def unordered(tree, path, builds):
    """(path, line, kind) of each expression with two operands that build IR."""
    known = {}  # id(node): whether it builds IR (each subtree asked once, not at every level above)

    def builds_ir(node):
        if id(node) not in known:
            name = callee_name(node) if node.get("kind") == "CallExpr" else ""
            here = name is None or name in builds or bool(name and BUILDS.match(name))
            known[id(node)] = any([here] + [builds_ir(child) for child in node.get("inner", [])])
        return known[id(node)]

    found = []

    def walk(node, last):
        last = line(node, last)
        kind, children = node.get("kind"), node.get("inner", [])
        operands = None
        if kind == "CallExpr":
            operands = children[1:]
        elif kind == "BinaryOperator" and node.get("opcode") not in UNSEQUENCED_OPERATORS:
            operands = children
        elif kind == "InitListExpr":
            operands = children
        if operands and sum(1 for o in operands if builds_ir(o)) >= 2:
            found.append((path, last, kind))
        for child in children:
            walk(child, last)

    files = files_of_functions(tree)
    for decl in tree.get("inner", []):
        if decl.get("kind") == "FunctionDecl" and files[id(decl)] and os.path.samefile(files[id(decl)], path):
            walk(decl, None)
    return found


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: evaluation_order.py CLANG LLVM_INCLUDE FILE...")
    clang, include, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    with tempfile.TemporaryDirectory() as folder:
        planted = os.path.join(folder, "planted.c")
        with open(planted, "w") as f:
            f.write(PLANTED)
        tree = syntax_tree(clang, include, planted)
        got = [place[1] for place in unordered(tree, planted, builders([tree]))]
        if got != [8]:
            sys.exit("FAIL: the planted case was found at lines %s, not at line 8" % got)
    trees = [(path, syntax_tree(clang, include, path)) for path in files]
    builds = builders([t for _, t in trees])
    found = sorted(set(p for path, tree in trees for p in unordered(tree, path, builds)))
    for path, at, kind in found:
        print("FAIL %s:%s: a %s with two operands that build IR (their order is the C compiler's)" %
              (os.path.relpath(path), at, kind))
    if found:
        sys.exit(1)
    print("ok   %d files, %d functions that build IR: every expression builds in one order" %
          (len(files), len(builds)))


if __name__ == "__main__":
    main()
