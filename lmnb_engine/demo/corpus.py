"""Seeded synthetic corpus for the demo model: a small invented world and tasks about it.

Everything here is written by this module (no outside text). The world is a handful of invented
people, cities and objects with attributes, plus one-digit sums, a number line and word-list
tasks. Each of these *facts* is stated in training in declarative sentences and JSON records.

The held-out split is made of *questions*: a fixed quarter of the facts (chosen by the seed) is
never asked in training in any question form (Q/A, multiple choice, few-shot, chat); only stated.
Word-list tasks and number-line questions are held out by a hash of their input, so held-out
items are new lists / numbers whose rule the model can learn from the training ones. So held-out
accuracy measures whether the model answers questions about things it read in another phrasing,
and applies patterns to new inputs — not whether it memorised the question text.

Public entry points: ``build_world``, ``training_documents``, ``heldout_items``.
"""

from __future__ import annotations

import itertools
import json
import random
import zlib
from dataclasses import dataclass, field

PEOPLE = (
    "Arvel Bexa Corin Dulma Eskel Fenna Garro Hesta Ivo Jorla Kestin Lirra Mabon Nessa Orrin "
    "Pella Quenby Rusk Sabine Tamsa"
).split()
CITIES = "Tessaly Orvane Mirwick Kelda Porrin Shalem Udrin Yarrow".split()
JOBS = "baker farmer painter doctor sailor teacher miner weaver".split()
PETS = "cat dog owl goat fox rabbit parrot turtle".split()
COLORS = "red blue green yellow purple orange white black".split()
OBJECTS = "lamp kettle drum clock kite ring bell mirror basket chair flute sled".split()
MATERIALS = "wood iron glass clay silver cloth".split()
REGIONS = "north south east west".split()
FEATURES = "bridge tower market harbor garden mill well gate".split()
LIST_WORDS = sorted(set(JOBS + PETS + COLORS + OBJECTS + MATERIALS))
NUMBER_WORDS = "zero one two three four five six seven eight nine".split()

HELDOUT_FRACTION = 0.25


@dataclass(frozen=True)
class Fact:
    """One (subject, relation, value) triple of the world, e.g. ("Arvel", "city", "Kelda")."""

    subject: str
    relation: str
    value: str


# relation -> (statement templates, question templates, chat-question templates, value pool key)
# Statements are how a fact is *told*; questions are how it is *asked*. Every held-out fact is
# told in training, never asked.
RELATIONS: dict[str, dict] = {
    "city": dict(
        tell=["{s} lives in {v}.", "{s} has a house in {v}.", "The home of {s} is {v}.",
              "{v} is where {s} lives.", "{s} is from the city of {v}."],
        ask=["Where does {s} live?", "In which city does {s} live?"],
        chat=["Where does {s} live?", "Do you know where {s} lives?", "Which city is {s} from?"],
        pool=CITIES),
    "job": dict(
        tell=["{s} works as a {v}.", "{s} is a {v}.", "The job of {s} is {v}.",
              "By trade, {s} is a {v}."],
        ask=["What is the job of {s}?", "What does {s} do for work?"],
        chat=["What does {s} do for a living?", "What is {s}'s job?"],
        pool=JOBS),
    "pet": dict(
        tell=["{s} has a pet {v}.", "{s} keeps a {v} at home.", "The pet of {s} is a {v}.",
              "A {v} lives with {s}."],
        ask=["What pet does {s} have?", "Which animal does {s} keep?"],
        chat=["What pet does {s} have?", "Does {s} have a pet?"],
        pool=PETS),
    "color": dict(
        tell=["The favorite color of {s} is {v}.", "{s} likes {v} best.",
              "{s} loves the color {v}.", "Of all colors, {s} likes {v} most."],
        ask=["What is the favorite color of {s}?", "Which color does {s} like best?"],
        chat=["What is {s}'s favorite color?", "Which color does {s} like?"],
        pool=COLORS),
    "object_color": dict(
        tell=["The {s} is {v}.", "The color of the {s} is {v}.", "There is a {v} {s}."],
        ask=["What color is the {s}?", "Of what color is the {s}?"],
        chat=["What color is the {s}?"],
        pool=COLORS),
    "material": dict(
        tell=["The {s} is made of {v}.", "The {s} is built from {v}.", "It is {v} that the {s} is made of."],
        ask=["What is the {s} made of?", "From what material is the {s} made?"],
        chat=["What is the {s} made of?"],
        pool=MATERIALS),
    "owner": dict(
        tell=["The {s} belongs to {v}.", "{v} owns the {s}.", "The owner of the {s} is {v}."],
        ask=["Who owns the {s}?", "To whom does the {s} belong?"],
        chat=["Who owns the {s}?", "Whose {s} is it?"],
        pool=PEOPLE),
    "region": dict(
        tell=["{s} lies in the {v}.", "The city of {s} is in the {v} of the land.",
              "Travel {v} to reach {s}."],
        ask=["In which part of the land is {s}?", "Is {s} in the north, south, east or west?"],
        chat=["Where is {s}?", "In which part of the land is {s}?"],
        pool=REGIONS),
    "feature": dict(
        tell=["{s} is known for its {v}.", "The famous sight of {s} is its {v}.",
              "People visit {s} to see the {v}."],
        ask=["What is {s} known for?", "What is the famous sight of {s}?"],
        chat=["What is {s} famous for?", "What should I see in {s}?"],
        pool=FEATURES),
    "sum": dict(
        tell=["{a} plus {b} is {v}.", "{a} + {b} = {v}", "Adding {a} and {b} gives {v}.",
              "The sum of {a} and {b} is {v}."],
        ask=["What is {a} + {b}?", "What is {a} plus {b}?"],
        chat=["What is {a} plus {b}?", "Can you add {a} and {b}?"],
        pool=[str(n) for n in range(19)]),
}
PERSON_RELATIONS = ("city", "job", "pet", "color")
OBJECT_RELATIONS = ("object_color", "material", "owner")
CITY_RELATIONS = ("region", "feature")


@dataclass
class World:
    """All facts of one seeded world, and which of them are held out from question forms."""

    facts: list[Fact]
    heldout: set[Fact] = field(default_factory=set)

    def by_subject(self, subject: str) -> list[Fact]:
        """The facts about ``subject``."""
        return [f for f in self.facts if f.subject == subject]

    @property
    def train_facts(self) -> list[Fact]:
        """The facts the training corpus states (all but the held-out ones)."""
        return [f for f in self.facts if f not in self.heldout]

    @property
    def heldout_facts(self) -> list[Fact]:
        """The facts kept out of training, for evaluation."""
        return [f for f in self.facts if f in self.heldout]


def build_world(seed: int = 0) -> World:
    """Assign attributes to every person, object and city with ``random.Random(seed)``.

    ``HELDOUT_FRACTION`` of the facts of each relation is held out from question forms.
    """
    rng = random.Random(seed)
    facts: list[Fact] = []
    for p in PEOPLE:
        facts += [Fact(p, "city", rng.choice(CITIES)), Fact(p, "job", rng.choice(JOBS)),
                  Fact(p, "pet", rng.choice(PETS)), Fact(p, "color", rng.choice(COLORS))]
    for o in OBJECTS:
        facts += [Fact(o, "object_color", rng.choice(COLORS)),
                  Fact(o, "material", rng.choice(MATERIALS)), Fact(o, "owner", rng.choice(PEOPLE))]
    for c in CITIES:
        facts += [Fact(c, "region", rng.choice(REGIONS)), Fact(c, "feature", rng.choice(FEATURES))]
    for a in range(10):
        for b in range(10):
            facts.append(Fact(f"{a} {b}", "sum", str(a + b)))
    heldout: set[Fact] = set()
    for rel in RELATIONS:
        group = [f for f in facts if f.relation == rel]
        heldout.update(rng.sample(group, max(1, round(len(group) * HELDOUT_FRACTION))))
    return World(facts, heldout)


def phrase(template: str, fact: Fact) -> str:
    """``template`` (a ``RELATIONS`` string with {s}/{v}, or {a}/{b}/{v} for sums) filled with ``fact``."""
    if fact.relation == "sum":
        a, b = fact.subject.split()
        return template.format(a=a, b=b, v=fact.value)
    return template.format(s=fact.subject, v=fact.value)


def tell(fact: Fact, rng: random.Random) -> str:
    """A declarative sentence stating ``fact`` (random template)."""
    return phrase(rng.choice(RELATIONS[fact.relation]["tell"]), fact)


def ask(fact: Fact, rng: random.Random, style: str = "ask") -> str:
    """A question about ``fact`` (``style`` "ask" for Q/A forms, "chat" for chat turns)."""
    return phrase(rng.choice(RELATIONS[fact.relation][style]), fact)


def answer_sentence(fact: Fact) -> str:
    """The full-sentence answer an assistant gives in chat (first statement template)."""
    return phrase(RELATIONS[fact.relation]["tell"][0], fact)


# ----- tasks that are not world facts: a number line and word lists -------------------------

@dataclass(frozen=True)
class Task:
    """One question with a short exact answer and a pool of wrong answers for multiple choice."""

    question: str
    answer: str
    distractors: tuple[str, ...]
    kind: str


def _is_heldout_key(key: str) -> bool:
    # A hash of the input (not the RNG) decides the split, so it never depends on draw order.
    return zlib.crc32(key.encode()) % 4 == 0


def number_task(n: int, rng: random.Random) -> Task:
    """"What number comes after/before n?" for 1 <= n <= 98."""
    if rng.random() < 0.5:
        q, a = f"What number comes after {n}?", str(n + 1)
    else:
        q, a = f"What number comes before {n}?", str(n - 1)
    near = {str(n + d) for d in (-2, -1, 1, 2, 10, -10) if 0 <= n + d <= 99} - {a}
    return Task(q, a, tuple(sorted(near)), "number")


def list_task(words: list[str], rng: random.Random) -> Task:
    """A question about a comma-separated word list: first, last, reverse or length."""
    shown = ", ".join(words)
    outside = rng.sample([w for w in LIST_WORDS if w not in words], 3)
    op = rng.choice(["first", "last", "reverse", "count"])
    if op == "first":
        q, a, d = f"What is the first word in: {shown}?", words[0], words[1:] + outside
    elif op == "last":
        q, a, d = f"What is the last word in: {shown}?", words[-1], words[:-1] + outside
    elif op == "reverse":
        q, a = f"Reverse the list: {shown}.", ", ".join(reversed(words))
        d = [", ".join(p) for p in itertools.permutations(words) if list(p) != words[::-1]]
    else:
        q, a = f"How many words are in: {shown}?", str(len(words))
        d = [str(k) for k in range(2, 7) if k != len(words)]
    return Task(q, a, tuple(dict.fromkeys(d)), "list")


def _number_tasks(heldout: bool, rng: random.Random) -> Task:
    while True:
        n = rng.randint(1, 98)
        t = number_task(n, rng)
        if _is_heldout_key(t.question) == heldout:
            return t


def _list_tasks(heldout: bool, rng: random.Random) -> Task:
    while True:
        words = rng.sample(LIST_WORDS, rng.randint(3, 5))
        if _is_heldout_key(", ".join(words)) == heldout:
            return list_task(words, rng)


def fact_task(fact: Fact, rng: random.Random) -> Task:
    """A Q/A task asking ``fact``; distractors are other values of the same relation."""
    pool = [v for v in RELATIONS[fact.relation]["pool"] if v != fact.value]
    return Task(ask(fact, rng), fact.value, tuple(pool), "fact")


def sample_task(world: World, rng: random.Random, heldout: bool) -> Task:
    """A task from the training or the held-out side: facts 60%, numbers 15%, lists 25%."""
    r = rng.random()
    if r < 0.6:
        facts = world.heldout_facts if heldout else world.train_facts
        return fact_task(rng.choice(facts), rng)
    if r < 0.75:
        return _number_tasks(heldout, rng)
    return _list_tasks(heldout, rng)


# ----- prompt formats (shared by training documents and the eval) ----------------------------

def qa_block(question: str, answer: str | None) -> str:
    """``"Q: <question>\\nA: <answer>"``; with ``answer=None`` the block ends at ``"A:"``."""
    return f"Q: {question}\nA:" + ("" if answer is None else f" {answer}")


def mc_prompt(question: str, options: list[str]) -> str:
    """Multiple-choice prompt; the choice is scored as the continuation ``" " + option``."""
    return f"Q: {question}\nOptions: {'; '.join(options)}\nA:"


def mc_options(task: Task, rng: random.Random) -> list[str]:
    """The task's answer with three of its distractors, shuffled."""
    options = rng.sample(list(task.distractors), 3) + [task.answer]
    rng.shuffle(options)
    return options


SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a helpful assistant who knows the people and places of the land.",
    "Answer briefly and correctly.",
    "You answer questions about the land.",
]
GREETINGS = [("Hello!", "Hello! How can I help you today?"),
             ("Hi there.", "Hi! What would you like to know?"),
             ("Good morning.", "Good morning! Ask me anything about the land."),
             ("Thank you!", "You are welcome."),
             ("Thanks, that helps.", "Glad to help."),
             ("Who are you?", "I am a small assistant that knows the people and places of the land.")]


def _chat_turn(world: World, rng: random.Random, heldout: bool) -> tuple[str, str]:
    """One (user, assistant) exchange; on the held-out side only held-out questions."""
    r = rng.random()
    if heldout:
        r = 0.0 if r < 0.6 else 0.8 + r / 5  # fact questions, or number / list tasks
    if r < 0.45:
        facts = world.heldout_facts if heldout else world.train_facts
        fact = rng.choice(facts)
        return ask(fact, rng, "chat"), answer_sentence(fact)
    if r < 0.6:
        return rng.choice(GREETINGS)
    if r < 0.7:
        subject = rng.choice(PEOPLE + OBJECTS + CITIES)
        facts = world.by_subject(subject)
        return f"Tell me about {_name(subject)}.", " ".join(answer_sentence(f) for f in facts)
    if r < 0.8:
        subject = rng.choice(PEOPLE + OBJECTS + CITIES)
        return f"Give me the record of {_name(subject)} as JSON.", json_record(world, subject, rng)
    task = _number_tasks(heldout, rng) if r < 0.88 else _list_tasks(heldout, rng)
    return task.question, f"The answer is {task.answer}."


def _name(subject: str) -> str:
    return subject if subject[0].isupper() else f"the {subject}"


def chat_dialogue(world: World, rng: random.Random, heldout: bool = False) -> list[dict]:
    """A 1–3 turn conversation as chat messages (``role``/``content`` dicts), optional system.

    On the held-out side the last user turn asks a held-out question and the final assistant
    turn is left out (the eval generates it).
    """
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    n_turns = rng.randint(1, 3)
    for i in range(n_turns):
        last = i == n_turns - 1
        user, reply = _chat_turn(world, rng, heldout and last)
        messages.append({"role": "user", "content": user})
        if not (heldout and last):
            messages.append({"role": "assistant", "content": reply})
    return messages


def json_record(world: World, subject: str, rng: random.Random) -> str:
    """A JSON object describing ``subject`` (keys in a random order, one line)."""
    kind = "person" if subject in PEOPLE else "object" if subject in OBJECTS else "city"
    rec = {f.relation.replace("object_", ""): f.value for f in world.by_subject(subject)}
    items = list(rec.items())
    rng.shuffle(items)
    return json.dumps({"name": subject, "kind": kind, **dict(items)})


# ----- training documents -------------------------------------------------------------------

@dataclass(frozen=True)
class Document:
    """A training document: plain ``text`` or chat ``messages`` (rendered with the template)."""

    kind: str
    text: str = ""
    messages: tuple = ()


def _bio(world: World, rng: random.Random) -> str:
    subject = rng.choice(PEOPLE + OBJECTS + CITIES)
    facts = world.by_subject(subject)
    rng.shuffle(facts)
    return " ".join(tell(f, rng) for f in facts)


def _arith_text(world: World, rng: random.Random) -> str:
    if rng.random() < 0.5:
        sums = [f for f in world.facts if f.relation == "sum"]
        return " ".join(tell(f, rng) for f in rng.sample(sums, 4))
    start = rng.randint(0, 90)
    return "Counting: " + ", ".join(str(n) for n in range(start, min(100, start + rng.randint(4, 10))))


def _few_shot(world: World, rng: random.Random, heldout_target: bool, n_shots: int) -> tuple[str, Task]:
    """``n_shots`` training Q/A shots of the target's kind, then the target question (ends at ``A:``)."""
    target = sample_task(world, rng, heldout_target)
    shots: list[str] = []
    while len(shots) < n_shots:
        t = sample_task(world, rng, False)
        if t.kind == target.kind and t.question != target.question:
            shots.append(qa_block(t.question, t.answer))
    return "\n\n".join(shots + [qa_block(target.question, None)]), target


def training_documents(seed: int = 0, n_docs: int = 60000) -> list[Document]:
    """``n_docs`` training documents drawn with ``random.Random(seed + 1)``; deterministic.

    Mix: fact statements (bios) 25%, JSON records 8%, number/sum statements 7%, single Q/A 12%,
    few-shot Q/A blocks 15%, multiple choice 15%, chat dialogues 18%. No held-out question
    (see module docstring) appears in any of them.
    """
    world = build_world(seed)
    rng = random.Random(seed + 1)
    docs: list[Document] = []
    for _ in range(n_docs):
        r = rng.random()
        if r < 0.25:
            docs.append(Document("bio", _bio(world, rng)))
        elif r < 0.33:
            docs.append(Document("json", json_record(world, rng.choice(PEOPLE + OBJECTS + CITIES), rng)))
        elif r < 0.40:
            docs.append(Document("arith", _arith_text(world, rng)))
        elif r < 0.52:
            t = sample_task(world, rng, False)
            docs.append(Document("qa", qa_block(t.question, t.answer)))
        elif r < 0.67:
            prompt, t = _few_shot(world, rng, False, rng.randint(1, 4))
            docs.append(Document("fewshot", f"{prompt} {t.answer}"))
        elif r < 0.82:
            t = sample_task(world, rng, False)
            docs.append(Document("mc", f"{mc_prompt(t.question, mc_options(t, rng))} {t.answer}"))
        else:
            docs.append(Document("chat", messages=tuple(chat_dialogue(world, rng))))
    return docs


# ----- held-out eval items ------------------------------------------------------------------

@dataclass(frozen=True)
class MCItem:
    """Pick the option whose continuation ``" " + option`` is most likely after ``prompt``."""

    prompt: str
    options: tuple[str, ...]
    answer: int  # index into options
    question: str
    kind: str


@dataclass(frozen=True)
class GenItem:
    """Few-shot item: greedy continuation of ``prompt`` up to a newline must equal ``answer``."""

    prompt: str
    answer: str
    question: str
    kind: str


@dataclass(frozen=True)
class ChatItem:
    """Conversation ending with a user turn; the assistant reply must end with EOS."""

    messages: tuple
    question: str


@dataclass(frozen=True)
class HeldOut:
    """The held-out evaluation items: multiple choice, few-shot and chat."""
    mc: list[MCItem]
    fewshot: list[GenItem]
    chat: list[ChatItem]


def heldout_items(seed: int = 0, n_mc: int = 400, n_fewshot: int = 300, n_chat: int = 200) -> HeldOut:
    """The held-out eval split, drawn with ``random.Random(seed + 2)``; deterministic.

    Every item's question is a held-out question: never asked in ``training_documents(seed)``.
    """
    world = build_world(seed)
    rng = random.Random(seed + 2)
    mc = []
    for _ in range(n_mc):
        t = sample_task(world, rng, True)
        options = mc_options(t, rng)
        mc.append(MCItem(mc_prompt(t.question, options), tuple(options), options.index(t.answer),
                         t.question, t.kind))
    fewshot = []
    for _ in range(n_fewshot):
        prompt, t = _few_shot(world, rng, True, 3)
        fewshot.append(GenItem(prompt, t.answer, t.question, t.kind))
    chat = []
    for _ in range(n_chat):
        msgs = chat_dialogue(world, rng, heldout=True)
        chat.append(ChatItem(tuple(msgs), msgs[-1]["content"]))
    return HeldOut(mc, fewshot, chat)
