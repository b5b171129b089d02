"""The toolkit as one package, overlay/Lib/usdt (docs/layout.md): pystack's
modules use only those before them, in the order its docstring gives, and
its BPF program, program.bt, has every fragment that program.py fills and
no other; nothing of the toolkit lives outside the package."""

import ast
import os
import re
import unittest

from support import TOP, USDT_PACKAGE, usdt_module

PYSTACK = os.path.join(USDT_PACKAGE, "pystack")


def documented_order():
    """The module names of usdt.pystack, in the order its docstring's
    paragraph "The modules, in the order each uses the ones before it"
    lists them."""
    with open(os.path.join(PYSTACK, "__init__.py")) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    paragraph = doc[doc.index("The modules, in the order"):].split("\n\n")[0]
    paragraph = " ".join(paragraph.split())
    # "offsets (what ...), program (the ...), ...": each name before its
    # parenthesis, after the colon.
    listed = paragraph.split(":", 1)[1]
    return re.findall(r"(?:^|\), )(\w+) \(", listed.strip())


def package_imports(path):
    """The modules of usdt.pystack that the module at path imports."""
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
                    "usdt.pystack."):
                found.add(node.module.split(".")[2])
    return found


class PystackModulesTest(unittest.TestCase):

    def test_modules_use_only_those_before_them(self):
        order = documented_order()
        modules = sorted(name[:-3] for name in os.listdir(PYSTACK)
                         if name.endswith(".py")
                         and not name.startswith("__"))
        self.assertEqual(sorted(order), modules,
                         "the docstring of usdt/pystack/__init__.py lists "
                         "every module once")
        for k, name in enumerate(order):
            used = package_imports(os.path.join(PYSTACK, name + ".py"))
            later = used - set(order[:k])
            self.assertFalse(later, "usdt.pystack.%s imports %s, listed "
                             "after it (or itself)" % (name, sorted(later)))

    def test_program_fragments_are_those_used(self):
        program = usdt_module("pystack.program")
        with open(os.path.join(PYSTACK, "program.py")) as f:
            used = set(re.findall(r'TEMPLATES\["(\w+)"\]', f.read()))
        self.assertTrue(used)
        self.assertEqual(set(program.TEMPLATES), used)
        for name, text in program.TEMPLATES.items():
            self.assertTrue(text.strip(), name)
            self.assertNotIn("// @@", text, name)

    def test_nothing_of_the_toolkit_outside_the_package(self):
        # The ready scripts and pystack were once in overlay/Tools/usdt,
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
