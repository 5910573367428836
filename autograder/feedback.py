"""A feedback preprocessor: tracebacks in test cells shrink to their last line.

nbgrader's feedback shows each test cell's outputs. A traceback through a test cell
quotes the failing source lines, hidden tests included, so ClearHiddenTests alone
is not enough. The learner keeps what matters: the exception and its message (for
the course's checkers, the diagnosis of the mistake).
"""

from nbgrader.preprocessors import NbGraderPreprocessor


class ShortenTestTracebacks(NbGraderPreprocessor):
    def preprocess_cell(self, cell, resources, index):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources
