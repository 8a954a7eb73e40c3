"""A correct outside method: the outside nucleus builder verified by recursive rejection (rule 3)."""

import good_nucleus  # noqa: F401  (registers the tree builder "outside-nucleus")

from specdec.methods import Method, register_method

register_method(Method("outside-nucleus-sd", tree="outside-nucleus", verifier="rejection-iid",
                       defaults={"width": (2, 1), "top_p": 0.8},
                       description="nucleus trees verified by recursive rejection"))
