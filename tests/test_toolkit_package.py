"""The toolkit as one package, overlay/Lib/usdt (docs/layout.md): the stack tool's
modules use only those before them, in the order its docstring gives, and
its BPF program, program.bt, has every fragment that program.py fills and
no other; nothing of the toolkit lives outside the package."""

import ast
import os
import re
import unittest

from support import PYTHON, TOP, USDT_PACKAGE, run, usdt_module

STACKS = os.path.join(USDT_PACKAGE, "stacks")


def documented_order():
    """The module names of usdt.stacks, in the order its docstring's
    paragraph "The modules, in the order each uses the ones before it"
    lists them."""
    with open(os.path.join(STACKS, "__init__.py")) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    paragraph = doc[doc.index("The modules, in the order"):].split("\n\n")[0]
    paragraph = " ".join(paragraph.split())
    # "offsets (what ...), program (the ...), ...": each name before its
    # parenthesis, after the colon.
    listed = paragraph.split(":", 1)[1]
    return re.findall(r"(?:^|\), )(\w+) \(", listed.strip())


def package_imports(path):
    """The modules of usdt.stacks that the module at path imports."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.level == 0 and node.module and node.module.startswith(
                    "usdt.stacks."):
                found.add(node.module.split(".")[2])
    return found


class StackToolModulesTest(unittest.TestCase):

    def test_modules_use_only_those_before_them(self):
        order = documented_order()
        modules = sorted(name[:-3] for name in os.listdir(STACKS)
                         if name.endswith(".py")
                         and not name.startswith("__"))
        self.assertEqual(sorted(order), modules,
                         "the docstring of usdt/stacks/__init__.py lists "
                         "every module once")
        for k, name in enumerate(order):
            used = package_imports(os.path.join(STACKS, name + ".py"))
            later = used - set(order[:k])
            self.assertFalse(later, "usdt.stacks.%s imports %s, listed "
                             "after it (or itself)" % (name, sorted(later)))

    def test_program_fragments_are_those_used(self):
        program = usdt_module("stacks.program")
        with open(os.path.join(STACKS, "program.py")) as f:
            used = set(re.findall(r'TEMPLATES\["(\w+)"\]', f.read()))
        self.assertTrue(used)
        self.assertEqual(set(program.TEMPLATES), used)
        for name, text in program.TEMPLATES.items():
            self.assertTrue(text.strip(), name)
            self.assertNotIn("// @@", text, name)

    def test_nothing_of_the_toolkit_outside_the_package(self):
        # The ready scripts and usdt.stacks were once in overlay/Tools/usdt,
        # copied into Lib/usdt at build time.  What lays the package into
        # the tree (tools/sync-toolkit, which tools/prepare runs) copies
        # overlay/Lib/usdt as it is, from nowhere else.
        self.assertFalse(os.path.exists(os.path.join(TOP, "overlay",
                                                     "Tools")))
        for name in ("prepare", "sync-toolkit"):
            with open(os.path.join(TOP, "tools", name)) as f:
                self.assertNotIn("Tools/usdt", f.read(), name)
        with open(os.path.join(TOP, "tools", "sync-toolkit")) as f:
            self.assertEqual(re.findall(r"^from=(.*)$", f.read(), re.M),
                             ["$TOP/overlay/Lib/usdt"])
        scripts = os.listdir(os.path.join(USDT_PACKAGE, "scripts"))
        self.assertTrue({"gil.bt", "gil.d", "gil.stp"} <= set(scripts))


if __name__ == "__main__":
    unittest.main()


class DeprecatedAliasTest(unittest.TestCase):
    """usdt.pystack, the stack tool's old name, runs it for one more
    release, and says so; usdt.stacks says nothing of it."""

    NOTE = ("usdt.pystack is deprecated and goes in the next release: use "
            "python -m usdt.stacks\n")

    def test_old_name_runs_the_tool_and_says_so(self):
        old = run([PYTHON, os.path.join(USDT_PACKAGE, "pystack"), "--help"],
                  timeout=60)
        self.assertEqual(old.returncode, 0, old.stderr)
        self.assertEqual(old.stderr, self.NOTE)
        new = run([PYTHON, STACKS, "--help"], timeout=60)
        self.assertEqual(new.returncode, 0, new.stderr)
        self.assertEqual(new.stderr, "")
        self.assertTrue(new.stdout.startswith("usage: usdt.stacks "),
                        new.stdout[:200])
        self.assertEqual(old.stdout, new.stdout)
