"""A LangGraph graph whose node runs as a Temporal activity, and the workflow that runs it,
under ``temporalio.langgraph.LangGraphPlugin`` (test_byvalue.py). A module of its own: a
zygote preloads a workflow's module, and LangGraph takes seconds to import."""

from datetime import timedelta
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from temporalio import workflow
from temporalio.langgraph import graph


class State(TypedDict):
    text: str


def shout(state: State) -> dict:
    return {"text": state["text"].upper() + "!"}


def make_graph() -> StateGraph:
    g = StateGraph(State)
    g.add_node("shout", shout, metadata={"execute_in": "activity",
                                         "start_to_close_timeout": timedelta(seconds=10)})
    g.add_edge(START, "shout")
    g.add_edge("shout", END)
    return g


@workflow.defn
class Graphed:
    @workflow.run
    async def run(self, text: str) -> dict:
        return await graph("shouting").compile().ainvoke({"text": text})
