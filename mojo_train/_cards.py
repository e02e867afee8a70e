"""The cards: every family's card generator, registered with the card format.

``mojo_train/_card_format.py`` reads, writes and checks card files and keeps the registry;
each ``mojo_train/_cards_<family>.py`` registers its cases and runners with it. This module
imports every family (so that the registry is complete) and is what selfcheck and the tests
use: the public names of _card_format are available here too.
"""
import importlib
import os

from ._card_format import *  # noqa: F401,F403 -- the card API, complete once the families are in
from ._card_format import CARD_SUFFIX, CASES, CardError, case_key, card_name, card_paths, check_card, \
    compare, fixtures_dirs, format_line, parse_case, read_card, write_missing  # noqa: F401

FAMILIES = tuple(sorted(f[len("_cards_"):-3] for f in os.listdir(os.path.dirname(os.path.abspath(__file__)))
                        if f.startswith("_cards_") and f.endswith(".py")))
for _family in FAMILIES:      # adding a family's _cards_<f>.py needs no edit here
    importlib.import_module("._cards_" + _family, __package__)
