"""An embedded training corpus: short children's stories generated from a small grammar, no download.

``generate_corpus(n_stories, seed)`` writes TinyStories-like text ("Once upon a time, there was a little
girl named Lily. She loved to ...") from a fixed lexicon (characters, places, objects, feelings) and a
handful of plots (a found object, a lost toy, a stuck kite, sharing, a scary noise, baking, a rainy day),
each told with several sentence templates. Pronouns, possessives, a / an and singular / plural verbs
agree. The vocabulary is a few hundred words, so a tiny model learns it quickly, while the choice of
plot, template and filler keeps the loss falling for a few hundred steps.

The output is a pure function of (n_stories, seed): it uses only ``random.Random`` draws (whose
sequence Python keeps stable across versions for an integer seed) over tuples, never set or dict order.
Stories are one line each, separated by a blank line. The default size is about 1.5 MB.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from anekit.errors import AnekitError

CORPUS_VERSION = 1  # bump when the grammar changes: cached tokenizers are keyed on it
DEFAULT_STORIES = 3000  # about 1.5 MB of text
DEFAULT_SEED = 0

T = TypeVar("T")

# --- the lexicon -------------------------------------------------------------------------------------

GIRL_NAMES = ("Lily", "Sue", "Mia", "Anna", "Lucy", "Emma", "Amy", "Sara", "Zoe", "Kate", "Ella", "Rose")
BOY_NAMES = ("Tom", "Ben", "Max", "Sam", "Tim", "Jack", "Leo", "Joe", "Bob", "Finn", "Alex", "Dan")
PET_NAMES = ("Spot", "Fluffy", "Coco", "Bella", "Pip", "Buddy", "Daisy", "Rocky", "Sunny", "Milo")
ANIMALS = ("dog", "cat", "bunny", "bird", "bear", "frog", "duck", "mouse", "fox", "owl", "elephant")
TRAITS = ("little", "small", "happy", "kind", "curious", "brave", "shy", "silly", "friendly", "old")
ACTIVITIES = (
    "play outside", "run in the grass", "sing songs", "draw pictures", "read books", "jump in puddles",
    "build with blocks", "dance", "look at the stars", "climb trees", "pick flowers", "play with {his} ball",
    "help {his} mom", "swim in the lake", "ride {his} bike", "play hide and seek",
)  # fmt: skip
# (place, the preposition of being there)
PLACES = (
    ("park", "in"), ("forest", "in"), ("garden", "in"), ("beach", "at"), ("lake", "by"), ("farm", "on"),
    ("zoo", "at"), ("big hill", "on"), ("river", "by"), ("meadow", "in"), ("backyard", "in"),
    ("playground", "at"),
)  # fmt: skip
COMPANIONS = ("mom", "dad", "grandma", "grandpa", "big sister", "big brother", "aunt", "uncle")
COLORS = ("red", "blue", "green", "yellow", "pink", "purple", "orange", "shiny", "big", "soft", "old")
TOYS = ("ball", "kite", "toy car", "doll", "teddy bear", "hat", "book", "balloon", "boat", "drum", "box")
FINDS = ("shell", "stone", "feather", "key", "coin", "leaf", "flower", "egg", "map", "bell", "ring")
HIDING = (
    "under a big tree", "behind a rock", "near the water", "in the tall grass", "under a bench",
    "next to a bush", "on top of a log", "inside an old box",
)  # fmt: skip
TIMES = ("day", "morning", "afternoon", "evening")
WEATHER = ("sunny", "rainy", "windy", "cold", "warm", "bright", "cloudy")
# (food, count: "one" takes a / an, "many" is plural, "some" is a mass noun; its ingredients)
FOODS = (
    ("cake", "one", "flour, eggs and sugar"), ("cookies", "many", "flour, butter and sugar"),
    ("apple pie", "one", "apples, flour and butter"), ("soup", "some", "carrots, potatoes and water"),
    ("pancakes", "many", "flour, milk and eggs"), ("muffins", "many", "flour, milk and berries"),
)  # fmt: skip
SCARY = ("a loud noise", "a big shadow", "a strange sound", "something moving in the bushes")
FEELINGS_GOOD = ("happy", "glad", "proud", "excited")
FEELINGS_BAD = ("sad", "scared", "worried", "upset")
SAY = ("said", "asked", "shouted", "whispered")


@dataclass(frozen=True)
class Character:
    """Someone in a story, with the words that must agree with them."""

    name: str
    noun: str  # girl, boy, dog, ...
    he: str  # she / he
    him: str  # her / him
    his: str  # her / his

    @property
    def He(self) -> str:
        """The pronoun capitalised, to start a sentence."""
        return self.he.capitalize()


def article(phrase: str) -> str:
    """The phrase with its indefinite article: "an old box", "a red ball"."""
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _cap(sentence: str) -> str:
    return sentence[0].upper() + sentence[1:]


@dataclass
class Plot:
    """The middle of a story: its sentences, the friend it introduced (if any) and the lessons it teaches."""

    sentences: list[str]
    friend: Character | None
    morals: tuple[str, ...]


class _Teller:
    """One story's random choices; each plot is a method returning a ``Plot``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def character(self, avoid: str = "") -> Character:
        kind = self.rng.randrange(5)  # 2 in 5 girls, 2 in 5 boys, 1 in 5 animals
        names: Sequence[str]
        if kind < 2:
            names, noun, pron = GIRL_NAMES, "girl", ("she", "her", "her")
        elif kind < 4:
            names, noun, pron = BOY_NAMES, "boy", ("he", "him", "his")
        else:
            names, noun = PET_NAMES, self.pick(ANIMALS)
            pron = ("she", "her", "her") if self.chance(0.5) else ("he", "him", "his")
        name = self.pick(names)
        while name == avoid:
            name = self.pick(names)
        return Character(name, noun, *pron)

    def thing(self, nouns: Sequence[str]) -> str:
        """An object with an adjective half the time: "shiny key", "kite"."""
        noun = self.pick(nouns)
        return f"{self.pick(COLORS)} {noun}" if self.chance(0.5) else noun

    def someone(self, c: Character) -> str:
        """How a story first names a character: "a girl named Sue"."""
        return f"{article(c.noun)} named {c.name}"

    def when(self) -> str:
        if self.chance(0.5):
            return f"One {self.pick(WEATHER)} {self.pick(TIMES)}"
        return f"One {self.pick(TIMES)}"

    def going(self, c: Character, place: tuple[str, str]) -> str:
        name, prep = place
        if self.chance(0.5):
            return f"{self.when()}, {c.name} went to the {name} with {c.his} {self.pick(COMPANIONS)}."
        return f"{self.when()}, {c.name} went to play {prep} the {name}."

    def quote(self, speaker: Character, words: str) -> str:
        """Dialogue with the tag after the words: '"Look!" said Lily.'."""
        verb = "asked" if words.endswith("?") else self.pick(("said", "said", "shouted", "whispered"))
        if words.endswith("."):
            words = words[:-1] + ","
        return f'"{words}" {verb} {speaker.name}.'

    # --- the parts every story shares ----------------------------------------------------------------

    def opening(self, c: Character) -> list[str]:
        who = article(f"{self.pick(TRAITS)} {c.noun}")
        first = self.pick(
            (
                f"Once upon a time, there was {who} named {c.name}.",
                f"Once upon a time, in a small town, there lived {who} named {c.name}.",
                f"There once was {who} named {c.name}.",
                f"{c.name} was {who}.",
            )
        )
        activity = self.pick(ACTIVITIES).format(his=c.his)
        second = self.pick(
            (
                f"{c.He} loved to {activity}.",
                f"{c.He} liked to {activity} every day.",
                f"Every day, {c.name} wanted to {activity}.",
                f"{c.He} was very good at making friends.",
            )
        )
        if c.noun in ("girl", "boy") and self.chance(0.3):
            return [first, f"{c.He} was {self.rng.randint(2, 10)} years old.", second]
        return [first, second]

    def ending(self, c: Character, plot: Plot) -> list[str]:
        out = []
        if plot.friend is not None and self.chance(0.6):
            f = plot.friend
            out.append(
                self.pick(
                    (
                        f"From that day on, {c.name} and {f.name} were best friends.",
                        f"{c.name} and {f.name} played together until the sun went down.",
                        "They laughed and had a lot of fun together.",
                    )
                )
            )
        if self.chance(0.5):
            out.append(f"{c.name} learned that {self.pick(plot.morals)}.")
        out.append(
            self.pick(
                (
                    "It was the best day ever.",
                    f"{c.He} went home with a big smile.",
                    f"That night, {c.name} went to sleep feeling {self.pick(FEELINGS_GOOD)}.",
                    "The end.",
                )
            )
        )
        return out

    # --- the plots -----------------------------------------------------------------------------------

    def found(self, c: Character) -> Plot:
        obj = self.thing(FINDS)
        out = [self.going(c, self.pick(PLACES))]
        out.append(
            self.pick(
                (
                    f"{c.He} saw {article(obj)} {self.pick(HIDING)}.",
                    f"{c.He} found {article(obj)} {self.pick(HIDING)}.",
                    f"Suddenly, {c.name} saw something {self.pick(HIDING)}. It was {article(obj)}!",
                )
            )
        )
        out.append(self.quote(c, self.pick(("Wow, look at this!", "What is this?", "I found a treasure!"))))
        if self.chance(0.5):
            f = self.character(avoid=c.name)
            out += [
                f"Then {self.someone(f)} came by.",
                self.quote(f, f"That is my {obj}. I lost it yesterday."),
                f"{c.name} felt a little {self.pick(FEELINGS_BAD)}, but {c.he} gave the {obj} to {f.name}.",
                self.quote(f, "Thank you! You are very kind."),
            ]
            return Plot(out, f, ("it is good to be honest", "you should always be kind"))
        out += [
            f"{c.He} picked up the {obj} and showed it to {c.his} {self.pick(COMPANIONS)}.",
            f"{c.He} put the {obj} in {c.his} pocket and kept it safe.",
        ]
        return Plot(out, None, ("small things can be treasures", "it is fun to explore"))

    def lost(self, c: Character) -> Plot:
        toy, (place, _) = self.thing(TOYS), self.pick(PLACES)
        f = self.character(avoid=c.name)
        out = [
            f"{c.name} had {article(toy)}. {c.He} loved the {toy} very much.",
            f"{self.when()}, {c.name} took the {toy} to the {place}.",
            f"{c.He} played all day, but when it was time to go home, the {toy} was gone!",
            f"{c.name} was very {self.pick(FEELINGS_BAD)}. {c.He} started to cry.",
            f"{_cap(self.someone(f))} saw {c.name} crying.",
            self.quote(f, f"Don't cry, {c.name}. I will help you find it."),
            f"They looked everywhere. At last, {f.name} found the {toy} {self.pick(HIDING)}.",
            f"{c.name} hugged {f.name}. " + self.quote(c, "Thank you for helping me!"),
        ]
        return Plot(out, f, ("friends help each other", "it is good to help others"))

    def stuck(self, c: Character) -> Plot:
        toy = self.pick(("kite", "ball", "balloon", "hat"))
        spot = self.pick(("in a tall tree", "on the roof", "on a high branch", "on top of the fence"))
        out = [
            self.going(c, self.pick(PLACES)),
            f"{c.He} brought {c.his} {self.pick(COLORS)} {toy}.",
            f"But the wind was strong, and the {toy} got stuck {spot}.",
            f"{c.name} tried to reach it, but it was too high.",
        ]
        if self.chance(0.5):
            f = self.character(avoid=c.name)
            helper = f.name if f.noun in ("girl", "boy") else f"{f.name} the {f.noun}"
            how = self.pick(("found a long stick", "climbed up", "got a ladder", "jumped very high"))
            out += [
                f"Just then, {helper} came to help.",
                f"{f.He} {how} and got the {toy} down.",
                f"{c.name} was so {self.pick(FEELINGS_GOOD)}.",
                self.quote(c, "Thank you, you are a good friend!"),
            ]
            return Plot(out, f, ("it is good to help others", "friends make everything better"))
        out += [
            f"{c.He} waited and waited. Then the wind blew again, and the {toy} fell down.",
            f"{c.name} caught it and laughed.",
        ]
        return Plot(out, None, ("being patient is good",))

    def sharing(self, c: Character) -> Plot:
        toy, f = self.thing(TOYS), self.character(avoid=c.name)
        place, prep = self.pick(PLACES)
        out = [
            f"{self.when()}, {c.name} was playing with {c.his} {toy} {prep} the {place}.",
            f"{_cap(self.someone(f))} came and watched.",
            self.quote(f, f"Can I play with your {toy}?"),
        ]
        if self.chance(0.5):
            out += [
                self.quote(c, f"No, it is my {toy}."),
                f"{f.name} was {self.pick(FEELINGS_BAD)} and walked away.",
                f"{c.name} played alone, but it was not fun anymore.",
                f"{c.He} ran to {f.name} and said sorry. " + self.quote(c, "Let's play together."),
            ]
            morals: tuple[str, ...] = ("it is good to say sorry", "sharing is fun")
        else:
            out.append(self.quote(c, "Yes, let's play together!"))
            morals = ("sharing is fun", "sharing makes friends")
        out.append(f"They took turns with the {toy}, and they both had fun.")
        return Plot(out, f, morals)

    def scary(self, c: Character) -> Plot:
        thing, f = self.pick(SCARY), self.character(avoid=c.name)
        place, prep = self.pick(PLACES)
        heard = "noise" in thing or "sound" in thing
        out = [
            f"{self.when()}, {c.name} was walking {prep} the {place}.",
            f"Suddenly, {c.he} {'heard' if heard else 'saw'} {thing}.",
            f"{c.name} was {self.pick(('scared', 'afraid', 'very scared'))}. {c.He} wanted to run home.",
            f"But {c.he} was brave and went to look.",
            f"It was just {self.someone(f)}!",
            self.quote(f, "Hello! I did not mean to scare you."),
            f"{c.name} smiled. " + self.quote(c, "Do you want to play with me?"),
        ]
        return Plot(out, f, ("being brave is important", "new friends can be anywhere"))

    def baking(self, c: Character) -> Plot:
        (food, count, ingredients), who = self.pick(FOODS), self.pick(COMPANIONS)
        it, was = ("they", "were") if count == "many" else ("it", "was")
        dish = article(food) if count == "one" else food
        out = [
            f"{self.when()}, {c.name} and {c.his} {who} wanted to make {dish}.",
            f"They got {ingredients}.",
            f"{c.name} helped mix everything in a big bowl.",
        ]
        if self.chance(0.5):
            out.append(f"Oops! {c.name} made a big mess on the table. They both laughed.")
        out += [
            f"Soon the {food} {was} ready. {_cap(it)} smelled so good!",
            self.quote(c, self.pick(("Yum! This is the best!", f"Can we make {food} again tomorrow?"))),
        ]
        return Plot(out, None, ("it is fun to cook together", "it is fun to try new things"))

    def rainy(self, c: Character) -> Plot:
        f = self.character(avoid=c.name)
        game = self.pick(
            ("build a fort", "play a game", "draw pictures", "read a book", "make a puppet show")
        )
        out = [
            f"One day, it was raining, and {c.name} could not go to the {self.pick(PLACES)[0]}.",
            f"{c.He} looked out the window and felt {self.pick(('sad', 'bored'))}.",
            f"Then {c.his} friend {f.name} came to visit.",
            self.quote(f, f"Let's {game}!"),
            "They had so much fun that they forgot about the rain.",
        ]
        if self.chance(0.5):
            out.append("When the rain stopped, they saw a big rainbow in the sky.")
        return Plot(out, f, ("friends make everything better", "you can have fun on a rainy day"))


PLOTS: tuple[Callable[[_Teller, Character], Plot], ...] = (
    _Teller.found, _Teller.lost, _Teller.stuck, _Teller.sharing, _Teller.scary, _Teller.baking, _Teller.rainy,
)  # fmt: skip


def generate_story(rng: random.Random) -> str:
    """One story (a single line) drawn with ``rng``."""
    teller = _Teller(rng)
    hero = teller.character()
    plot = teller.pick(PLOTS)(teller, hero)
    sentences = teller.opening(hero) + plot.sentences + teller.ending(hero, plot)
    return " ".join(_cap(s) for s in sentences)


def generate_corpus(n_stories: int = DEFAULT_STORIES, seed: int = DEFAULT_SEED) -> str:
    """``n_stories`` stories separated by a blank line; the same text for the same (n_stories, seed)."""
    if n_stories < 1:
        raise AnekitError(f"[corpus] n_stories must be >= 1, got {n_stories}")
    rng = random.Random(seed)
    return "\n\n".join(generate_story(rng) for _ in range(n_stories)) + "\n"
