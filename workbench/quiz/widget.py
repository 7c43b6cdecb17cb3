"""The quiz in a notebook: ipywidgets, graded in the kernel, score recorded in a Scorebook.

Each question is a card (prompt, input, "Check" button, feedback). CSS classes ``wb-quiz``,
``wb-quiz-question``, ``wb-quiz-check`` and ``wb-quiz-feedback`` let a browser test find them.
Choices appear in the learner's own order (:mod:`workbench.quiz.learner`); a Check with nothing
picked is refused and not counted; the first graded attempt's score is the one kept, and the
explanation follows it. Outside a live kernel (``WORKBENCH_VIZ=static``) :func:`show_quiz`
prints the questions as text.
"""

from __future__ import annotations

import html

from workbench.errors import ConfigError
from workbench.quiz.bank import load_chapter_quiz
from workbench.quiz.grader import Grade, Scorebook, default_scores_path, parse_number
from workbench.quiz.learner import ChoiceOrder, learner_token
from workbench.quiz.schema import Question, Quiz

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


def _feedback_html(g: Grade, kept: float | None = None) -> str:
    head = "✔ Correct." if g.correct else ("Partly right." if g.score > 0 else "✘ Not quite.")
    color = "#1a7f37" if g.correct else "#b35900"
    lines = "".join(f"<li>{html.escape(f)}</li>" for f in g.feedback)
    note = "" if kept is None else (
        f"<div class='wb-quiz-kept'><b>Already answered, first score kept: {kept:g} / 1.</b> "
        "This retry is graded for your understanding and does not change the score.</div>")
    return (f"<div style='border-left:4px solid {color};padding-left:8px'>{note}"
            f"<b style='color:{color}'>{head}</b><ul style='margin:2px 0'>{lines}</ul>"
            f"<i>Why:</i> {html.escape(g.explanation)}</div>")


def _refusal_html(text: str) -> str:
    return f"<i class='wb-quiz-refused'>{html.escape(text)} (Not counted as an attempt.)</i>"


class QuestionCard:
    """One question's widgets; ``select()`` and ``check()`` drive it from code (tests).
    ``order`` says which quiz-file choice each display position shows."""

    def __init__(self, q: Question, number: int, book: Scorebook, on_graded=None,
                 order: ChoiceOrder | None = None):
        import ipywidgets as w

        self.q, self.book, self.on_graded = q, book, on_graded
        self.order = order or ChoiceOrder.identity(q)
        self.grade: Grade | None = None
        hint = {"single": "(one answer)", "multiple": "(tick every correct answer)",
                "numeric": f"(a number{', in ' + q.unit if q.unit else ''})"}[q.kind]
        prompt = w.HTML(f"<b>Q{number}.</b> {html.escape(q.prompt)} <i>{hint}</i>")
        texts = [q.choices[i].text for i in self.order.order]
        if q.kind == "single":
            self.input = w.RadioButtons(options=[(t, j) for j, t in enumerate(texts)],
                                        value=None, layout=w.Layout(width="auto"))
        elif q.kind == "multiple":
            self.boxes = [w.Checkbox(value=False, description=t, indent=False,
                                     layout=w.Layout(width="auto")) for t in texts]
            self.input = w.VBox(self.boxes)
        else:  # text, not FloatText: a blank field must read as "no answer", not as 0
            self.input = w.Text(value="", placeholder="a number",
                                description=q.unit or "answer")
        self.button = w.Button(description="Check", button_style="primary")
        self.button.add_class("wb-quiz-check")
        self.feedback = w.HTML("")
        if book.is_answered(q.id):
            self.feedback.value = (f"<i>Answered before: first score {book.first[q.id]:g} / 1 "
                                   "kept.</i>")
        self.feedback.add_class("wb-quiz-feedback")
        self.button.on_click(lambda _b: self.check())
        self.box = w.VBox([prompt, self.input, self.button, self.feedback])
        self.box.add_class("wb-quiz-question")

    def select(self, value) -> None:
        """Set the answer as a learner would: a display position, a list of them, a number,
        or None / [] / "" for nothing."""
        if self.q.kind == "single":
            self.input.value = value
        elif self.q.kind == "multiple":
            for j, b in enumerate(self.boxes):
                b.value = j in set(value or ())
        else:
            self.input.value = "" if value is None else str(value)

    def select_choices(self, indices) -> None:
        """Tick the quiz file's choices ``indices`` (an int or ints), wherever they are shown."""
        if isinstance(indices, int):
            self.select(self.order.to_display(indices))
        else:
            self.select([self.order.to_display(i) for i in indices])

    def response(self):
        """The answer in quiz-file indices (or a number); None when nothing is given."""
        if self.q.kind == "single":
            return self.order.to_original(self.input.value)
        if self.q.kind == "multiple":
            return self.order.to_original([j for j, b in enumerate(self.boxes) if b.value])
        return parse_number(self.input.value)

    def check(self) -> Grade | None:
        """Grade and record the answer; refuse (None, nothing recorded) an empty one."""
        try:
            r = self.response()
        except ConfigError as err:  # text in a number field
            self.feedback.value = _refusal_html(f"{err.what} {err.why}; {err.fix}.")
            return None
        if r is None or r == []:
            self.feedback.value = _refusal_html(
                "Type a number first: a blank field is not 0." if self.q.kind == "numeric"
                else "Pick an answer first: nothing is ticked.")
            return None
        kept = self.book.first[self.q.id] if self.book.is_answered(self.q.id) else None
        self.grade = self.book.answer(self.q.id, r)
        self.feedback.value = _feedback_html(self.grade, kept)
        if self.on_graded:
            self.on_graded()
        return self.grade


class QuizWidget:
    """All questions of one quiz plus a running score line. ``token`` fixes the choice order
    (default: this learner's token)."""

    def __init__(self, quiz: Quiz, book: Scorebook | None = None, token: str | None = None):
        import ipywidgets as w

        self.quiz = quiz
        self.book = book or Scorebook(quiz, path=default_scores_path())
        self.token = learner_token() if token is None else token
        self.score = w.HTML(self._score_text())
        self.score.add_class("wb-quiz-score")
        self.where = w.HTML(self._where_text())
        self.where.add_class("wb-quiz-where")
        self.cards = [QuestionCard(q, i + 1, self.book, self._refresh,
                                   ChoiceOrder.for_learner(q, self.token))
                      for i, q in enumerate(quiz.questions)]
        title = w.HTML(_CSS + f"<h3>Quiz: {html.escape(quiz.title)}</h3>")
        self.box = w.VBox([title] + [c.box for c in self.cards] + [self.score, self.where])
        self.box.add_class("wb-quiz")

    def _score_text(self) -> str:
        return f"<b>{html.escape(self.book.summary())}</b>"

    def _where_text(self) -> str:
        """Where the first attempts are kept, so a learner can find (or reset) them."""
        if self.book.path is None:
            return "<small>Scores are kept in memory only (WORKBENCH_SCORES is empty).</small>"
        return (f"<small>Scores are kept in <code>{html.escape(str(self.book.path))}</code> "
                "(set WORKBENCH_SCORES to another file, or to empty for memory only).</small>")

    def _refresh(self) -> None:
        self.score.value = self._score_text()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.box)


def quiz_text(quiz: Quiz, token: str) -> str:
    """The quiz as plain text (static output: exported HTML, a terminal), choices in the
    learner's order."""
    out = [f"Quiz: {quiz.title}"]
    for n, q in enumerate(quiz.questions, 1):
        out.append(f"Q{n}. {q.prompt}")
        order = ChoiceOrder.for_learner(q, token).order if q.choices else ()
        out += [f"   [{chr(97 + j)}] {q.choices[i].text}" for j, i in enumerate(order)]
        if q.kind == "numeric":
            out.append(f"   answer in {q.unit or 'a number'}")
    return "\n".join(out)


def show_quiz(name: str, *, live: bool | None = None) -> QuizWidget | None:
    """Load, check and display chapter ``name``'s quiz (e.g. "02_elastic_memory"); returns the
    widget (None in static mode)."""
    from IPython.display import display

    from workbench.viz.live import is_live

    quiz = load_chapter_quiz(name)
    if not (is_live() if live is None else live):
        print(quiz_text(quiz, learner_token()))
        return None
    qw = QuizWidget(quiz)
    display(qw.box)
    return qw
