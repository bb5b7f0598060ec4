"""An import-linter contract type for names inside an external package.

import-linter's own `forbidden` contract sees an external package as one module
(`pyspark`), so it cannot say "only `sparkdist.spark` imports `pyspark.sql.connect.plan`"
while every path may import `pyspark.sql`. This contract reads the import lines grimp
records and refuses those naming a forbidden module or name, outside the allowed modules.
"""

from __future__ import annotations

from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class ForbiddenExternalNames(Contract):
    """Options: `container` (checked package), `allowed_modules` (may import them),
    `forbidden` (dotted names: modules or names inside an external package)."""

    type_name = "forbidden_external_names"

    container = fields.StringField()
    allowed_modules = fields.ListField(subfield=fields.StringField())
    forbidden = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        allowed = tuple(self.allowed_modules)
        forbidden = tuple(self.forbidden)
        externals = {name.split(".")[0] for name in forbidden}
        broken = []
        for importer in sorted(graph.find_descendants(self.container)):
            if any(importer == a or importer.startswith(a + ".") for a in allowed):
                continue
            for external in externals & graph.find_modules_directly_imported_by(importer):
                for detail in graph.get_import_details(importer=importer, imported=external):
                    line = detail["line_contents"]
                    names = _imported_names(line)
                    hit = sorted(f for f in forbidden if any(_within(n, f) for n in names))
                    if hit:
                        broken.append((importer, detail["line_number"], line, hit))
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        from importlinter.application import output

        for importer, line_number, line, hit in check.metadata["broken"]:
            output.print_error(f"{importer}:{line_number} `{line}` uses {', '.join(hit)}")
            output.new_line()


def _within(name: str, forbidden: str) -> bool:
    return name == forbidden or name.startswith(forbidden + ".")


def _imported_names(line: str) -> list[str]:
    """`from a.b import c, d as e` -> [a.b.c, a.b.d]; `import a.b as c` -> [a.b]."""
    words = line.replace("(", " ").replace(")", " ").replace(",", " ").split()
    if words[:1] == ["from"] and "import" in words:
        base = words[1]
        rest = words[words.index("import") + 1 :]
        names = [w for i, w in enumerate(rest) if w != "as" and (i == 0 or rest[i - 1] != "as")]
        return [base] + [f"{base}.{n}" for n in names]
    if words[:1] == ["import"]:
        return [w for i, w in enumerate(words[1:]) if w != "as" and words[i] != "as"]
    return []
