"""The quiz in a notebook: ipywidgets, graded in the kernel, score recorded in a Scorebook.

Each question is a card (prompt, input, "Check" button, feedback). CSS classes ``wb-quiz``,
``wb-quiz-question``, ``wb-quiz-check`` and ``wb-quiz-feedback`` let a browser test find them.
Outside a live kernel (``WORKBENCH_VIZ=static``) :func:`show_quiz` prints the questions as text.
"""

from __future__ import annotations

import html
from pathlib import Path

from workbench.quiz.grader import Grade, Scorebook, default_scores_path
from workbench.quiz.schema import Question, Quiz, load_quiz

# Long choice texts wrap instead of overlapping (ipywidgets gives radio labels a fixed height).
_CSS = """<style>
.wb-quiz .widget-radio-box label, .wb-quiz .widget-checkbox label {
  height: auto !important; line-height: 1.35 !important; white-space: normal !important;
  overflow: visible !important; display: flex !important; align-items: flex-start;
  justify-content: flex-start !important; margin: 3px 0 !important; }
.wb-quiz .widget-radio-box input, .wb-quiz .widget-checkbox input {
  flex-shrink: 0; order: -1; margin: 3px 6px 0 0 !important; }
.wb-quiz .widget-checkbox { height: auto !important; width: auto !important; }
</style>"""


def _feedback_html(g: Grade) -> str:
    head = "✔ Correct." if g.correct else ("Partly right." if g.score > 0 else "✘ Not quite.")
    color = "#1a7f37" if g.correct else "#b35900"
    lines = "".join(f"<li>{html.escape(f)}</li>" for f in g.feedback)
    return (f"<div style='border-left:4px solid {color};padding-left:8px'>"
            f"<b style='color:{color}'>{head}</b><ul style='margin:2px 0'>{lines}</ul>"
            f"<i>Why:</i> {html.escape(g.explanation)}</div>")


class QuestionCard:
    """One question's widgets; ``select()`` and ``check()`` drive it from code (tests)."""

    def __init__(self, q: Question, number: int, book: Scorebook, on_graded=None):
        import ipywidgets as w

        self.q, self.book, self.on_graded = q, book, on_graded
        self.grade: Grade | None = None
        hint = {"single": "(one answer)", "multiple": "(tick every correct answer)",
                "numeric": f"(a number{', in ' + q.unit if q.unit else ''})"}[q.kind]
        prompt = w.HTML(f"<b>Q{number}.</b> {html.escape(q.prompt)} <i>{hint}</i>")
        opts = [(c.text, i) for i, c in enumerate(q.choices)]
        if q.kind == "single":
            self.input = w.RadioButtons(options=opts, value=None,
                                        layout=w.Layout(width="auto"))
        elif q.kind == "multiple":
            self.boxes = [w.Checkbox(value=False, description=t, indent=False,
                                     layout=w.Layout(width="auto")) for t, _ in opts]
            self.input = w.VBox(self.boxes)
        else:
            self.input = w.FloatText(value=0.0, description=q.unit or "answer")
        self.button = w.Button(description="Check", button_style="primary")
        self.button.add_class("wb-quiz-check")
        self.feedback = w.HTML("")
        self.feedback.add_class("wb-quiz-feedback")
        self.button.on_click(lambda _b: self.check())
        self.box = w.VBox([prompt, self.input, self.button, self.feedback])
        self.box.add_class("wb-quiz-question")

    def select(self, value) -> None:
        """Set the answer as a learner would: an index, a list of indices or a number."""
        if self.q.kind == "single":
            self.input.value = value
        elif self.q.kind == "multiple":
            for i, b in enumerate(self.boxes):
                b.value = i in set(value)
        else:
            self.input.value = float(value)

    def response(self):
        if self.q.kind == "single":
            return self.input.value
        if self.q.kind == "multiple":
            return [i for i, b in enumerate(self.boxes) if b.value]
        return self.input.value

    def check(self) -> Grade | None:
        r = self.response()
        if r is None:
            self.feedback.value = "<i>Pick an answer first.</i>"
            return None
        self.grade = self.book.answer(self.q.id, r)
        self.feedback.value = _feedback_html(self.grade)
        if self.on_graded:
            self.on_graded()
        return self.grade


class QuizWidget:
    """All questions of one quiz plus a running score line."""

    def __init__(self, quiz: Quiz, book: Scorebook | None = None):
        import ipywidgets as w

        self.quiz = quiz
        self.book = book or Scorebook(quiz, path=default_scores_path())
        self.score = w.HTML(self._score_text())
        self.score.add_class("wb-quiz-score")
        self.cards = [QuestionCard(q, i + 1, self.book, self._refresh)
                      for i, q in enumerate(quiz.questions)]
        title = w.HTML(_CSS + f"<h3>Quiz: {html.escape(quiz.title)}</h3>")
        self.box = w.VBox([title] + [c.box for c in self.cards] + [self.score])
        self.box.add_class("wb-quiz")

    def _score_text(self) -> str:
        return f"<b>{html.escape(self.book.summary())}</b>"

    def _refresh(self) -> None:
        self.score.value = self._score_text()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.box)


def quiz_text(quiz: Quiz) -> str:
    """The quiz as plain text (static output: exported HTML, a terminal)."""
    out = [f"Quiz: {quiz.title}"]
    for n, q in enumerate(quiz.questions, 1):
        out.append(f"Q{n}. {q.prompt}")
        out += [f"   [{chr(97 + i)}] {c.text}" for i, c in enumerate(q.choices)]
        if q.kind == "numeric":
            out.append(f"   answer in {q.unit or 'a number'}")
    return "\n".join(out)


def show_quiz(path: str | Path, *, live: bool | None = None) -> QuizWidget | None:
    """Load, check and display a chapter's quiz; returns the widget (None in static mode)."""
    from IPython.display import display

    from workbench.viz.live import is_live

    quiz = load_quiz(path)
    if not (is_live() if live is None else live):
        print(quiz_text(quiz))
        return None
    qw = QuizWidget(quiz)
    display(qw.box)
    return qw
