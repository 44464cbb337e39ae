"""Structured output on the schemas pydantic writes for real models.

usage: schemas.py BASE_URL

Each model below is turned into its JSON Schema by pydantic (model_json_schema, as
the structured-output libraries do), sent to `llamay serve` (alternately through the
official ollama client's `format=` and the openai client's `response_format`), and
every answer is checked twice: by the `jsonschema` validator (Draft 2020-12, formats
checked) and by pydantic's own model_validate_json. The answers are sampled (a seed
per schema), so that they wander through the grammar rather than repeat one path.
A schema the grammar cannot enforce must be a 400 naming the keyword.
Prints `ok NAME` per schema; a failure exits non-zero.
"""

import datetime as dt
import enum
import json
import sys
import uuid
from ipaddress import IPv4Address
from typing import Annotated, Dict, List, Literal, Optional, Tuple, Union

import jsonschema
import ollama
import openai
from pydantic import BaseModel, EmailStr, Field, HttpUrl, conint, constr

BASE = sys.argv[1]
MODEL = "gemma3:270m"


class Colour(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Priority(int, enum.Enum):
    low = 1
    high = 2


class Age(BaseModel):
    age: Annotated[int, Field(ge=0, le=130)]


class Percent(BaseModel):
    value: Annotated[float, Field(ge=0, le=100)]


class Probability(BaseModel):
    p: Annotated[float, Field(gt=0, lt=1)]


class Temperature(BaseModel):
    celsius: Annotated[int, Field(gt=-274, lt=10000)]


class NegativeOffset(BaseModel):
    offset: conint(le=-1)


class Username(BaseModel):
    username: constr(min_length=3, max_length=16)


class Code(BaseModel):
    code: Annotated[str, Field(pattern=r"^[A-Z]{3}-\d{4}$")]


class Slug(BaseModel):
    slug: Annotated[str, Field(pattern=r"^[a-z0-9]{1,12}(?:-[a-z0-9]{1,12}){0,3}$")]


class Event(BaseModel):
    name: Annotated[str, Field(max_length=40)]
    starts: dt.datetime


class Birthday(BaseModel):
    person: Annotated[str, Field(max_length=30)]
    born: dt.date


class Alarm(BaseModel):
    at: dt.time
    snooze: Optional[dt.timedelta] = None


class Record(BaseModel):
    id: uuid.UUID
    created: dt.datetime


class Paint(BaseModel):
    colour: Colour
    litres: Annotated[float, Field(gt=0, le=20)]


class Ticket(BaseModel):
    title: Annotated[str, Field(max_length=50)]
    priority: Priority
    status: Literal["open", "closed", "pending"]


class Maybe(BaseModel):
    nickname: Optional[str] = None
    score: Optional[int] = None


class Address(BaseModel):
    street: Annotated[str, Field(max_length=40)]
    city: Annotated[str, Field(max_length=30)]
    zip: Annotated[str, Field(pattern=r"^\d{5}$")]


class Person(BaseModel):
    name: Annotated[str, Field(max_length=30)]
    address: Address
    previous: Annotated[List[Address], Field(max_length=2)] = []


class Tags(BaseModel):
    tags: Annotated[List[Annotated[str, Field(max_length=12)]], Field(min_length=1, max_length=4)]


class Point(BaseModel):
    xy: Tuple[int, int]


class Labelled(BaseModel):
    entry: Tuple[Annotated[str, Field(max_length=10)], float, bool]


class Inventory(BaseModel):
    counts: Annotated[Dict[str, Annotated[int, Field(ge=0)]], Field(max_length=3)]


class Shape(BaseModel):
    kind: Union[int, str, None]


class Cat(BaseModel):
    pet_type: Literal["cat"]
    lives: Annotated[int, Field(ge=1, le=9)]


class Dog(BaseModel):
    pet_type: Literal["dog"]
    good: bool


class Owner(BaseModel):
    pet: Union[Cat, Dog] = Field(discriminator="pet_type")


class Contact(BaseModel):
    email: EmailStr
    website: HttpUrl


class Host(BaseModel):
    name: Annotated[str, Field(pattern=r"^[a-z]{1,10}\.local$")]
    ip: IPv4Address


class Step(BaseModel):
    n: Annotated[int, Field(ge=1, le=10)]
    text: Annotated[str, Field(max_length=40)]


class Recipe(BaseModel):
    title: Annotated[str, Field(max_length=40)]
    steps: Annotated[List[Step], Field(min_length=1, max_length=3)]
    vegetarian: bool


class Member(BaseModel):
    name: Annotated[str, Field(max_length=20)]
    role: Literal["lead", "dev", "qa"]


class Team(BaseModel):
    team: Annotated[str, Field(max_length=20)]
    members: Annotated[List[Member], Field(min_length=1, max_length=3)]


class Invoice(BaseModel):
    number: Annotated[int, Field(ge=1000, le=99999)]
    total: Annotated[float, Field(ge=0)]
    currency: Literal["EUR", "USD", "GBP"]
    paid: bool = False


class Flags(BaseModel):
    enabled: bool
    mode: Literal[1, 2, 3]
    ratio: Annotated[float, Field(ge=-1, le=1)]


class Movie(BaseModel):
    title: Annotated[str, Field(max_length=40)]
    year: Annotated[int, Field(ge=1888, le=2030)]
    rating: Annotated[int, Field(ge=1, le=5)]
    genres: Annotated[List[Literal["drama", "comedy", "action", "horror"]], Field(max_length=3)]


class Weather(BaseModel):
    city: Annotated[str, Field(max_length=20)]
    temperature: Annotated[int, Field(ge=-90, le=60)]
    unit: Literal["C", "F"] = "C"
    observed: dt.datetime


class Version(BaseModel):
    version: Annotated[str, Field(pattern=r"^v?\d{1,3}\.\d{1,3}\.\d{1,3}$")]


class Coordinates(BaseModel):
    lat: Annotated[float, Field(ge=-90, le=90)]
    lon: Annotated[float, Field(ge=-180, le=180)]


MODELS = [
    Age, Percent, Probability, Temperature, NegativeOffset, Username, Code, Slug, Event,
    Birthday, Alarm, Record, Paint, Ticket, Maybe, Person, Tags, Point, Labelled, Inventory,
    Shape, Owner, Contact, Host, Recipe, Team, Invoice, Flags, Movie, Weather, Version,
    Coordinates,
]


def validator(schema):
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def main():
    ol = ollama.Client(host=BASE)
    oa = openai.OpenAI(base_url=BASE + "/v1", api_key="none")
    for i, model in enumerate(MODELS):
        schema = model.model_json_schema()
        prompt = f"Write one example {model.__name__} as JSON."
        # A 270M model loops on digits inside an open string now and then; a mild
        # repetition penalty (Ollama's default is 1.1) keeps answers finishing.
        opts = {"temperature": 0.8, "seed": 100 + i, "num_predict": 600, "repeat_penalty": 1.15}
        if i % 2 == 0:
            r = ol.generate(model=MODEL, prompt=prompt, format=schema, options=opts)
            text, why = r.response, r.done_reason
        else:
            r = oa.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0.8,
                seed=100 + i, max_tokens=600, frequency_penalty=0.5,
                response_format={"type": "json_schema", "json_schema": {"name": model.__name__, "schema": schema}})
            text, why = r.choices[0].message.content, r.choices[0].finish_reason
        assert why == "stop", f"{model.__name__}: stopped by {why}: {text!r}"
        errors = [e.message for e in validator(schema).iter_errors(json.loads(text))]
        assert not errors, f"{model.__name__}: {text} fails {errors}\nschema: {json.dumps(schema)}"
        model.model_validate_json(text)
        print("ok", model.__name__, text, flush=True)

    # A pattern with a lookahead (JSON Schema allows it; a grammar cannot enforce it):
    # refused by name, not ignored.
    schema = {"type": "object", "properties": {"user": {"type": "string", "pattern": "^(?!admin)[a-z]+$"}}}
    try:
        ol.generate(model=MODEL, prompt="A user:", format=schema, options={"num_predict": 8})
        raise AssertionError("a lookahead pattern was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "lookaround" in e.error, e.error
    print("ok a lookahead pattern is a 400 naming it", flush=True)
    print(f"ok {len(MODELS)} schemas, every answer valid", flush=True)


main()
