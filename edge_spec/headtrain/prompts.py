"""The prompt set for self-distilling a draft head: topics crossed with task templates.

A small draft head learns to predict the target model's next tokens from the target's own hidden
states. The training data comes from the target itself: it answers these prompts greedily, and
its hidden states and chosen tokens are recorded. The prompts were written for this project and
aim for variety rather than size: 160 topics from many domains (science, history, cooking,
programming, sport, everyday life, ...) crossed with 16 task templates of different shapes
(explanations, stories, bullet lists, poems, code, email, FAQ, dialogue, JSON, markdown tables,
...), so that the head sees prose, lists, structured text and code.

Every template has two forms:

* ``chat``: an instruction, sent as the user message to a chat model (SmolLM2-135M-Instruct);
* ``text``: the start of a document that a base model (Gemma-3-270M) would plausibly continue.

About one topic in six is held out (chosen by a stable hash of the topic, see
:func:`held_out_topic`); all prompts on a held-out topic are kept for evaluation, so the head is
measured on subjects it never trained on, not just on unseen pairings of seen subjects.

Templates use ``{topic}`` for the topic as written and ``{Topic}`` for it with a capital first
letter (at the start of a line or sentence). They are filled in with plain string replacement,
not :meth:`str.format`, so the JSON and code openers may contain literal braces.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

__all__ = [
    "TEMPLATES",
    "TOPICS",
    "HeadPrompt",
    "Template",
    "head_prompts",
    "held_out_topic",
]

HELD_OUT_ONE_IN = 6  # about one topic in this many is held out for evaluation


@dataclass(frozen=True)
class Template:
    """A task with a ``{topic}`` slot, in an instruction form and a document-prefix form."""

    name: str  # a short name, e.g. "explain"
    chat: str  # the user message for a chat model
    text: str  # the document prefix for a base model

    def fill(self, topic: str) -> tuple[str, str]:
        """(chat, text) with the topic filled in."""
        return _fill(self.chat, topic), _fill(self.text, topic)


@dataclass(frozen=True)
class HeadPrompt:
    topic: str
    task: str  # the template's short name, e.g. "explain"
    chat: str  # the user message for a chat model
    text: str  # the document prefix for a base model
    held_out: bool


def _fill(template: str, topic: str) -> str:
    capitalised = topic[:1].upper() + topic[1:]
    return template.replace("{Topic}", capitalised).replace("{topic}", topic)


TOPICS: tuple[str, ...] = (
    # science
    "photosynthesis",
    "black holes",
    "the water cycle",
    "plate tectonics",
    "DNA replication",
    "the periodic table",
    "climate change",
    "vaccines",
    "the theory of evolution",
    "magnetism",
    "volcanoes",
    # history
    "the French Revolution",
    "the Roman Empire",
    "the printing press",
    "the Industrial Revolution",
    "ancient Egypt",
    "the Silk Road",
    "the Moon landing",
    "the fall of the Berlin Wall",
    "the Renaissance",
    "the Vikings",
    # geography
    "the Amazon rainforest",
    "the Sahara desert",
    "the Himalayas",
    "ocean currents",
    "the Great Barrier Reef",
    "Iceland",
    "river deltas",
    "the Nile",
    "time zones",
    # cooking
    "sourdough bread",
    "pasta sauces",
    "fermentation",
    "knife skills",
    "spices",
    "baking cookies",
    "vegetarian cooking",
    "sushi",
    "coffee brewing",
    # programming and software
    "binary search",
    "recursion",
    "hash tables",
    "version control with git",
    "unit testing",
    "regular expressions",
    "object-oriented programming",
    "linked lists",
    "SQL databases",
    "REST APIs",
    "sorting algorithms",
    # mathematics
    "prime numbers",
    "the Pythagorean theorem",
    "probability",
    "fractions",
    "calculus",
    "statistics",
    "logarithms",
    "graph theory",
    "the Fibonacci sequence",
    # health
    "sleep",
    "hydration",
    "strength training",
    "meditation",
    "nutrition labels",
    "the immune system",
    "posture",
    "first aid",
    "stress",
    # sports and games
    "soccer",
    "chess",
    "marathon training",
    "tennis",
    "swimming",
    "the Olympic Games",
    "basketball",
    "cycling",
    "yoga",
    "rock climbing",
    # music
    "the piano",
    "jazz",
    "learning the guitar",
    "classical symphonies",
    "rhythm",
    "music theory",
    "choirs",
    "hip hop",
    # art
    "watercolor painting",
    "impressionism",
    "sculpture",
    "photography",
    "calligraphy",
    "street art",
    "color theory",
    "pottery",
    # economics and money
    "inflation",
    "supply and demand",
    "compound interest",
    "personal budgeting",
    "international trade",
    "taxes",
    "central banks",
    "the stock market",
    "unemployment",
    # everyday life
    "houseplants",
    "doing laundry",
    "moving house",
    "morning routines",
    "recycling",
    "keeping a journal",
    "public libraries",
    "dogs",
    # travel
    "train travel",
    "packing a suitcase",
    "camping",
    "visiting Paris",
    "road trips",
    "airports",
    "learning a language abroad",
    # nature
    "honeybees",
    "migratory birds",
    "oak trees",
    "coral reefs",
    "wolves",
    "mushrooms",
    "thunderstorms",
    "ocean tides",
    # technology
    "smartphones",
    "solar panels",
    "electric cars",
    "the internet",
    "3D printing",
    "artificial intelligence",
    "batteries",
    "GPS navigation",
    "robots",
    "cloud computing",
    # literature and language
    "Shakespeare",
    "fairy tales",
    "science fiction",
    "detective novels",
    "haiku",
    "Greek mythology",
    "Sherlock Holmes",
    "writing a good essay",
    # business and work
    "starting a small business",
    "marketing",
    "customer service",
    "project management",
    "job interviews",
    "remote work",
    "negotiation",
    "supply chains",
    "leadership",
    # mind, society and ideas
    "memory",
    "habits",
    "critical thinking",
    "democracy",
    "public speaking",
    "friendship",
    "Stoicism",
)

TEMPLATES: tuple[Template, ...] = (
    Template(
        name="explain",
        chat="Explain {topic} in simple terms, as if to a curious twelve-year-old.",
        text="Title: A simple explanation of {topic}\n\n"
        "If you have ever wondered about {topic}, here is the idea in plain words.",
    ),
    Template(
        name="story",
        chat="Write a short story, about 150 words long, in which {topic} plays an important part.",
        text="A Short Story\n\nOnce upon a time, in a small town where everyone was talking "
        "about {topic},",
    ),
    Template(
        name="bullets",
        chat="Give five useful facts or practical tips about {topic}, as a bulleted list.",
        text="Five things worth knowing about {topic}\n\n- ",
    ),
    Template(
        name="poem",
        chat="Write a short poem of eight lines about {topic}.",
        text="A Poem About {Topic}\n\n",
    ),
    Template(
        name="compare",
        chat="Compare two contrasting aspects of {topic}, or two ways of approaching the "
        "subject, and explain how they differ.",
        text="{Topic}: two sides compared\n\n"
        "There are two quite different ways to look at {topic}. The first",
    ),
    Template(
        name="howto",
        chat="Describe, step by step, how a complete beginner could start learning about {topic}.",
        text="A beginner's guide to {topic}, step by step\n\nStep 1:",
    ),
    Template(
        name="python",
        chat="Write a short Python program related to {topic}: for example, one that stores a "
        "few facts about it in a list of dictionaries and prints them neatly.",
        text='"""A small program about {topic}: it stores a few facts and prints them."""\n\n'
        "from __future__ import annotations\n\n\n",
    ),
    Template(
        name="email",
        chat="Write a short, friendly email to your colleagues proposing a one-hour workshop "
        "on {topic}.",
        text="Subject: A workshop on {topic}\n\nDear team,\n\n"
        "I am writing to propose a short workshop on {topic}.",
    ),
    Template(
        name="faq",
        chat="Write a FAQ about {topic} with four questions and a short answer to each.",
        text="# {Topic}: frequently asked questions\n\nQ:",
    ),
    Template(
        name="dialogue",
        chat="Write a short dialogue between a student and a teacher who are discussing {topic}.",
        text="A conversation about {topic}\n\n"
        "Student: Could you tell me something about {topic}?\nTeacher:",
    ),
    Template(
        name="summary",
        chat="Write a one-paragraph summary of {topic} for an encyclopedia.",
        text="Encyclopedia entry: {Topic}\n\n{Topic}",
    ),
    Template(
        name="pros_cons",
        chat="List the benefits and the challenges associated with {topic}, as two bulleted "
        "lists with a short introduction.",
        text="{Topic}: benefits and challenges\n\nBenefits:\n- ",
    ),
    Template(
        name="quiz",
        chat="Write a five-question multiple-choice quiz about {topic}, with the correct "
        "answers listed at the end.",
        text="Quiz: how much do you know about {topic}?\n\n1.",
    ),
    Template(
        name="json",
        chat='Describe {topic} as a JSON object with the keys "name", "category", "summary" '
        'and "key_facts" (a list of strings). Reply with the JSON only.',
        text='{\n  "name": "{topic}",\n  "category": "',
    ),
    Template(
        name="table",
        chat="Make a markdown table with three columns (term, meaning, example) that lists "
        "five key terms related to {topic}.",
        text="## Key terms: {topic}\n\n| Term | Meaning | Example |\n|---|---|---|\n|",
    ),
    Template(
        name="tweet",
        chat="Write a tweet, under 280 characters, that makes people curious about {topic}.",
        text="Posted by @curious_minds\n\nToday's fun fact about {topic}:",
    ),
)


def held_out_topic(topic: str) -> bool:
    """Whether a topic is kept for evaluation: about one in six, chosen by a stable hash
    (SHA-256 of the topic), so the split is the same in every process and Python version."""
    digest = hashlib.sha256(topic.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % HELD_OUT_ONE_IN == 0


def head_prompts(*, held_out: bool | None = None, seed: int = 0) -> list[HeadPrompt]:
    """Every (topic, template) pair once, in a deterministic order drawn from
    ``random.Random(seed)``.

    The order comes in rounds: each round pairs every topic with one template, the templates
    rotating from round to round (a Latin square over shuffled topics and templates) and each
    round shuffled within itself. So any prefix of the list spreads over many topics, and the
    first ``len(TOPICS)`` prompts cover every topic once and every template about equally.

    ``held_out=None`` gives every prompt; ``True`` or ``False`` only those whose topic is (or is
    not) held out. The filter is applied after ordering, so for one seed the filtered lists are
    subsequences of the full list.
    """
    rng = random.Random(seed)
    topics = list(TOPICS)
    templates = list(TEMPLATES)
    rng.shuffle(topics)
    rng.shuffle(templates)
    pairs: list[tuple[str, Template]] = []
    for round_index in range(len(templates)):
        round_pairs = [
            (topic, templates[(i + round_index) % len(templates)]) for i, topic in enumerate(topics)
        ]
        rng.shuffle(round_pairs)
        pairs.extend(round_pairs)
    prompts: list[HeadPrompt] = []
    for topic, template in pairs:
        topic_held_out = held_out_topic(topic)
        if held_out is not None and topic_held_out != held_out:
            continue
        chat, text = template.fill(topic)
        prompts.append(HeadPrompt(topic, template.name, chat, text, topic_held_out))
    return prompts
